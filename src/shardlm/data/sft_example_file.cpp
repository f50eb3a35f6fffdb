#include "shardlm/data/sft_example_file.hpp"

#include <bit>
#include <cstring>

#include "shardlm/core/error.hpp"
#include "shardlm/data/token_file.hpp"

namespace shardlm {
namespace {

static_assert(std::endian::native == std::endian::little, "SFT files are little-endian; so is this code");

struct SftFileHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t token_bytes;
  uint64_t vocab_size;
  uint64_t example_count;
  uint64_t token_count;
  uint8_t reserved[24];
};
static_assert(sizeof(SftFileHeader) == kSftFileHeaderBytes);

constexpr const char* kExpected = "an SFT example file written by `shardlm prepare --sft`";

}  // namespace

void SftExamples::add(std::span<const int32_t> example_tokens, std::span<const uint8_t> example_mask) {
  SHARDLM_ASSERT(example_tokens.size() == example_mask.size());
  tokens.insert(tokens.end(), example_tokens.begin(), example_tokens.end());
  mask.insert(mask.end(), example_mask.begin(), example_mask.end());
  offsets.push_back(static_cast<int64_t>(tokens.size()));
}

SftExampleFileWriter::SftExampleFileWriter(const std::string& path, int64_t vocab_size, const SftExamples& examples)
    : file_(path) {
  SHARDLM_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 31),
                "cannot write SFT example file {}: vocab size {} (expected 1..2^31)", path, vocab_size);
  SHARDLM_ASSERT(examples.offsets.size() >= 1 && examples.offsets.back() == static_cast<int64_t>(examples.tokens.size()));
  for (size_t i = 0; i < examples.tokens.size(); ++i)
    SHARDLM_CHECK(examples.tokens[i] >= 0 && examples.tokens[i] < vocab_size,
                  "cannot write SFT example file {}: token {} at position {} is outside the vocabulary [0, {})", path,
                  examples.tokens[i], i, vocab_size);
  SftFileHeader header{};
  std::memcpy(header.magic, kSftFileMagic, sizeof(header.magic));
  header.format_version = kSftFileFormatVersion;
  header.token_bytes = static_cast<uint32_t>(token_bytes_for_vocab(vocab_size));
  header.vocab_size = static_cast<uint64_t>(vocab_size);
  header.example_count = static_cast<uint64_t>(examples.size());
  header.token_count = examples.tokens.size();
  file_.write(&header, sizeof(header));
  file_.write(examples.offsets.data(), examples.offsets.size() * sizeof(int64_t));
  if (header.token_bytes == 2) {
    std::vector<uint16_t> narrow(examples.tokens.begin(), examples.tokens.end());
    file_.write(narrow.data(), narrow.size() * sizeof(uint16_t));
  } else {
    file_.write(examples.tokens.data(), examples.tokens.size() * sizeof(int32_t));
  }
  file_.write(examples.mask.data(), examples.mask.size());
  file_.finish();
}

SftExampleFile::SftExampleFile(const std::string& path)
    : path_(path), file_(path, "SFT example file", kExpected, kSftFileHeaderBytes) {
  SftFileHeader header;
  std::memcpy(&header, file_.data(), sizeof(header));
  SHARDLM_CHECK(std::memcmp(header.magic, kSftFileMagic, sizeof(header.magic)) == 0,
                "{} is not a shardlm SFT example file (bad magic; expected {})", path, kExpected);
  check_token_header(path, "SFT example file", header.format_version, kSftFileFormatVersion, header.vocab_size,
                     header.token_bytes);
  const uint64_t limit = uint64_t{1} << 40;  // keeps the size arithmetic below from overflowing
  SHARDLM_CHECK(header.example_count < limit && header.token_count < limit,
                "SFT example file {}: {} examples and {} tokens in the header (corrupt file)", path,
                header.example_count, header.token_count);
  const uint64_t expected_size = kSftFileHeaderBytes + (header.example_count + 1) * 8 +
                                 header.token_count * (header.token_bytes + 1);
  SHARDLM_CHECK(file_.size() == expected_size,
                "SFT example file {}: the header says {} examples and {} tokens ({} bytes) but the file has {} bytes "
                "(truncated or corrupt)", path, header.example_count, header.token_count, expected_size, file_.size());
  examples_ = static_cast<int64_t>(header.example_count);
  tokens_count_ = static_cast<int64_t>(header.token_count);
  vocab_size_ = static_cast<int64_t>(header.vocab_size);
  token_bytes_ = static_cast<int>(header.token_bytes);
  offsets_ = reinterpret_cast<const uint64_t*>(file_.data() + kSftFileHeaderBytes);
  tokens_ = file_.data() + kSftFileHeaderBytes + (examples_ + 1) * 8;
  mask_ = tokens_ + tokens_count_ * token_bytes_;

  SHARDLM_CHECK(offsets_[0] == 0 && offsets_[examples_] == header.token_count,
                "SFT example file {}: offsets run from {} to {} (expected 0 to the token count {})", path, offsets_[0],
                offsets_[examples_], header.token_count);
  for (int64_t e = 0; e < examples_; ++e)
    SHARDLM_CHECK(offsets_[e + 1] >= offsets_[e] + 2 && offsets_[e + 1] <= header.token_count,
                  "SFT example file {}: example {} spans tokens [{}, {}) (expected at least 2 tokens, in order)", path,
                  e, offsets_[e], offsets_[e + 1]);
  for (int64_t i = 0; i < tokens_count_; ++i) {
    SHARDLM_CHECK(static_cast<uint64_t>(token(i)) < header.vocab_size,
                  "SFT example file {}: token {} at position {} is not below the vocab size {} (corrupt file)", path,
                  static_cast<uint32_t>(token(i)), i, vocab_size_);
    SHARDLM_CHECK(mask_[i] <= 1, "SFT example file {}: mask byte {} at position {} (expected 0 or 1)", path,
                  mask_[i], i);
  }
}

}  // namespace shardlm
