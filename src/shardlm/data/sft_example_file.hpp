// SFT example files (DIR/train.sft, DIR/val.sft): tokenized conversations with a
// per-token loss mask. Format (docs/data-format.md), all integers little-endian:
//   0   magic "SHLMSFT\0"
//   8   u32 format_version (1)
//   12  u32 token_bytes (2 when vocab_size <= 65536, else 4)
//   16  u64 vocab_size
//   24  u64 example_count (n)
//   32  u64 token_count
//   40  24 reserved bytes (zero)
//   64  (n + 1) x u64 offsets: example e is tokens [offsets[e], offsets[e + 1])
//   ..  token_count x token_bytes: the tokens
//   ..  token_count x u8: the mask, 1 when the token is a loss target (predicted from
//       the token before it), 0 when not
// Readers memory-map the file and validate it completely on open.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardlm/core/file_util.hpp"
#include "shardlm/data/mapped_file.hpp"

namespace shardlm {

inline constexpr char kSftFileMagic[8] = {'S', 'H', 'L', 'M', 'S', 'F', 'T', '\0'};
inline constexpr uint32_t kSftFileFormatVersion = 1;
inline constexpr int64_t kSftFileHeaderBytes = 64;

// Examples being collected in memory (prepare holds a split at a time).
struct SftExamples {
  std::vector<int64_t> offsets{0};  // size = examples + 1
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;

  int64_t size() const { return static_cast<int64_t>(offsets.size()) - 1; }
  void add(std::span<const int32_t> example_tokens, std::span<const uint8_t> example_mask);
};

// Writes `examples` to a temporary file beside `path` (fsynced); commit() renames
// it into place, so several outputs can appear together. Destroyed uncommitted, the
// temporary is removed. Error for a token outside [0, vocab_size) or on I/O failure.
class SftExampleFileWriter {
 public:
  SftExampleFileWriter(const std::string& path, int64_t vocab_size, const SftExamples& examples);
  void commit() { file_.commit(); }

 private:
  AtomicFileWriter file_;
};

// A read-only, memory-mapped SFT example file. Opening checks the header, the file
// size, that offsets start at 0, never decrease and end at token_count, that every
// example has at least 2 tokens, every token is below vocab_size and every mask
// byte is 0 or 1; each problem is a one-line Error naming the file. Move-only.
class SftExampleFile {
 public:
  explicit SftExampleFile(const std::string& path);

  const std::string& path() const { return path_; }
  int64_t num_examples() const { return examples_; }
  int64_t num_tokens() const { return tokens_count_; }
  int64_t vocab_size() const { return vocab_size_; }

  // Unchecked (hot path): e in [0, num_examples()), i in [0, num_tokens()).
  int64_t example_begin(int64_t e) const { return offsets_[e]; }
  int64_t example_length(int64_t e) const { return offsets_[e + 1] - offsets_[e]; }
  int32_t token(int64_t i) const {
    return token_bytes_ == 2 ? static_cast<int32_t>(reinterpret_cast<const uint16_t*>(tokens_)[i])
                             : static_cast<int32_t>(reinterpret_cast<const uint32_t*>(tokens_)[i]);
  }
  bool is_target(int64_t i) const { return mask_[i] != 0; }

 private:
  std::string path_;
  MappedFile file_;
  const uint64_t* offsets_ = nullptr;
  const unsigned char* tokens_ = nullptr;
  const uint8_t* mask_ = nullptr;
  int64_t examples_ = 0;
  int64_t tokens_count_ = 0;
  int64_t vocab_size_ = 0;
  int token_bytes_ = 0;
};

}  // namespace shardlm
