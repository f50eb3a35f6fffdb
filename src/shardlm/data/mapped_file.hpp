// A whole file memory-mapped read-only (token files, SFT example files).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace shardlm {

class MappedFile {
 public:
  MappedFile() = default;
  // Error naming `path` and `what` ("token file", "SFT example file") when the file
  // cannot be opened, is not a regular file, is shorter than `min_bytes`, or cannot
  // be mapped; `expected` says what it should have been.
  MappedFile(const std::string& path, std::string_view what, std::string_view expected, size_t min_bytes);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return static_cast<const unsigned char*>(mapping_); }
  size_t size() const { return bytes_; }

 private:
  void close();
  void* mapping_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace shardlm
