// Token files (train.bin / val.bin): a 64-byte header, then the tokens as
// little-endian uint16 (vocab <= 65536) or uint32. Format: docs/data-format.md.
// Readers memory-map the file and validate it completely on open.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "shardlm/data/mapped_file.hpp"

namespace shardlm {

inline constexpr char kTokenFileMagic[8] = {'S', 'H', 'L', 'M', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kTokenFileFormatVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 64;

// Bytes per token for a vocabulary: 2 when every id fits in uint16, else 4.
int token_bytes_for_vocab(int64_t vocab_size);

// The header checks of files that carry tokens (token files, SFT example files):
// format_version in 1..newest, vocab_size in 1..2^31, token_bytes as
// token_bytes_for_vocab says. Error naming `what` ("token file") and `path`.
void check_token_header(const std::string& path, std::string_view what, uint32_t format_version, uint32_t newest,
                        uint64_t vocab_size, uint32_t token_bytes);

// Writes a token file atomically: tokens go to a temporary file in the same
// directory, and commit() renames it onto `path` (fsynced). Until commit(),
// `path` is untouched; a writer destroyed without commit() removes its
// temporary file. Error if a token is outside [0, vocab_size) or on I/O failure.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, int64_t vocab_size);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const int32_t> tokens);
  // Completes the header and syncs the temporary file (still not visible).
  void finish();
  // finish() if needed, then rename onto the path.
  void commit();
  int64_t count() const { return count_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t vocab_size_;
  int64_t count_ = 0;
  bool finished_ = false;
};

// TokenFileWriter in one call.
void write_token_file(const std::string& path, int64_t vocab_size, std::span<const int32_t> tokens);

// A read-only, memory-mapped token file. Opening checks the header and scans
// every token once; each problem is a one-line Error naming the file and what
// was expected. Move-only.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  TokenFile(TokenFile&& other) noexcept = default;
  TokenFile& operator=(TokenFile&& other) noexcept = default;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // number of tokens
  int64_t vocab_size() const { return vocab_size_; }
  int token_bytes() const { return token_bytes_; }  // 2 or 4

  // Unchecked (hot path): index must be in [0, size()).
  int32_t operator[](int64_t index) const {
    return token_bytes_ == 2 ? static_cast<int32_t>(reinterpret_cast<const uint16_t*>(tokens_)[index])
                             : static_cast<int32_t>(reinterpret_cast<const uint32_t*>(tokens_)[index]);
  }
  // Copies tokens [start, start + count) into out; Error if out of range.
  void read(int64_t start, int64_t count, int32_t* out) const;

 private:
  std::string path_;
  MappedFile file_;
  const unsigned char* tokens_ = nullptr;
  int64_t count_ = 0;
  int64_t vocab_size_ = 0;
  int token_bytes_ = 0;
};

}  // namespace shardlm
