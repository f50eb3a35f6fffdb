// SHA-256 through OpenSSL: digests of files (data provenance, checkpoint shards)
// and of weights (`shardlm inspect`).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace shardlm {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes);
  std::string hex_digest();  // finalises; the object must not be updated afterwards

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(const void* data, size_t bytes);
std::string sha256_file_hex(const std::string& path);  // throws Error if unreadable

}  // namespace shardlm
