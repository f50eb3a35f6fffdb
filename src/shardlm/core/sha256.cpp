#include "shardlm/core/sha256.hpp"

#include <openssl/evp.h>

#include <fstream>
#include <vector>

#include "shardlm/core/error.hpp"

namespace shardlm {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  SHARDLM_ASSERT(impl_->ctx != nullptr);
  SHARDLM_ASSERT(EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::update(const void* data, size_t bytes) {
  SHARDLM_ASSERT(EVP_DigestUpdate(impl_->ctx, data, bytes) == 1);
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  SHARDLM_ASSERT(EVP_DigestFinal_ex(impl_->ctx, digest, &length) == 1);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

std::string sha256_hex(const void* data, size_t bytes) {
  Sha256 hasher;
  hasher.update(data, bytes);
  return hasher.hex_digest();
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SHARDLM_CHECK(in.good(), "cannot read file '{}'", path);
  Sha256 hasher;
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    if (in.gcount() > 0) hasher.update(chunk.data(), static_cast<size_t>(in.gcount()));
  }
  SHARDLM_CHECK(in.eof(), "error while reading file '{}'", path);
  return hasher.hex_digest();
}

}  // namespace shardlm
