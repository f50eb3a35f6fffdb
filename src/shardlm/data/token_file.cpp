#include "shardlm/data/token_file.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"

namespace shardlm {
namespace {

static_assert(std::endian::native == std::endian::little, "token files are little-endian; so is this code");

// The on-disk header; every field little-endian. Reserved bytes are written as
// zero and ignored on read, so version 1 readers accept additions there.
struct TokenFileHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t token_bytes;
  uint64_t vocab_size;
  uint64_t token_count;
  uint8_t reserved[32];
};
static_assert(sizeof(TokenFileHeader) == kTokenFileHeaderBytes);

template <typename T>
int64_t first_token_at_or_above(const T* tokens, int64_t count, uint64_t limit) {
  // One vectorisable pass for the maximum; the position is searched only on failure.
  T max_token = 0;
  for (int64_t i = 0; i < count; ++i) max_token = std::max(max_token, tokens[i]);
  if (static_cast<uint64_t>(max_token) < limit) return -1;
  for (int64_t i = 0; i < count; ++i)
    if (static_cast<uint64_t>(tokens[i]) >= limit) return i;
  return -1;
}

}  // namespace

int token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void check_token_header(const std::string& path, std::string_view what, uint32_t format_version, uint32_t newest,
                        uint64_t vocab_size, uint32_t token_bytes) {
  SHARDLM_CHECK(format_version >= 1 && format_version <= newest,
                "{} {} has format version {} (this build reads versions 1..{}; a newer shardlm wrote it)", what, path,
                format_version, newest);
  SHARDLM_CHECK(vocab_size >= 1 && vocab_size <= (uint64_t{1} << 31),
                "{} {}: vocab size {} in the header (expected 1..2^31)", what, path, vocab_size);
  const int expected_bytes = token_bytes_for_vocab(static_cast<int64_t>(vocab_size));
  SHARDLM_CHECK(token_bytes == static_cast<uint32_t>(expected_bytes),
                "{} {}: {}-byte tokens in the header (expected {} for vocab size {})", what, path, token_bytes,
                expected_bytes, vocab_size);
}

struct TokenFileWriter::Impl {
  explicit Impl(const std::string& path) : file(path) {}
  AtomicFileWriter file;
  TokenFileHeader header{};
  std::vector<unsigned char> chunk;
};

TokenFileWriter::TokenFileWriter(const std::string& path, int64_t vocab_size) : vocab_size_(vocab_size) {
  SHARDLM_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 31),
                "cannot write token file {}: vocab size {} (expected 1..2^31)", path, vocab_size);
  impl_ = std::make_unique<Impl>(path);
  TokenFileHeader& header = impl_->header;
  std::memcpy(header.magic, kTokenFileMagic, sizeof(header.magic));
  header.format_version = kTokenFileFormatVersion;
  header.token_bytes = static_cast<uint32_t>(token_bytes_for_vocab(vocab_size));
  header.vocab_size = static_cast<uint64_t>(vocab_size);
  header.token_count = 0;  // completed by finish()
  impl_->file.write(&header, sizeof(header));
}

TokenFileWriter::~TokenFileWriter() = default;

void TokenFileWriter::append(std::span<const int32_t> tokens) {
  SHARDLM_CHECK(!finished_, "internal error: append to finished token file {}", impl_->file.path());
  for (size_t i = 0; i < tokens.size(); ++i)
    SHARDLM_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_,
                  "cannot write token file {}: token {} at position {} is outside the vocabulary [0, {})",
                  impl_->file.path(), tokens[i], count_ + static_cast<int64_t>(i), vocab_size_);
  constexpr size_t kChunkTokens = 1 << 16;
  const size_t token_bytes = impl_->header.token_bytes;
  impl_->chunk.resize(std::min(kChunkTokens, tokens.size()) * token_bytes);
  for (size_t start = 0; start < tokens.size(); start += kChunkTokens) {
    const size_t n = std::min(kChunkTokens, tokens.size() - start);
    if (token_bytes == 2) {
      auto* out = reinterpret_cast<uint16_t*>(impl_->chunk.data());
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(tokens[start + i]);
    } else {
      auto* out = reinterpret_cast<uint32_t*>(impl_->chunk.data());
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(tokens[start + i]);
    }
    impl_->file.write(impl_->chunk.data(), n * token_bytes);
  }
  count_ += static_cast<int64_t>(tokens.size());
}

void TokenFileWriter::finish() {
  if (finished_) return;
  impl_->header.token_count = static_cast<uint64_t>(count_);
  impl_->file.write_at(&impl_->header, sizeof(impl_->header), 0);
  impl_->file.finish();
  finished_ = true;
}

void TokenFileWriter::commit() {
  finish();
  impl_->file.commit();
}

void write_token_file(const std::string& path, int64_t vocab_size, std::span<const int32_t> tokens) {
  TokenFileWriter writer(path, vocab_size);
  writer.append(tokens);
  writer.commit();
}

TokenFile::TokenFile(const std::string& path)
    : path_(path),
      file_(path, "token file", "a shardlm token file written by `shardlm prepare`", kTokenFileHeaderBytes) {
  TokenFileHeader header;
  std::memcpy(&header, file_.data(), sizeof(header));
  SHARDLM_CHECK(std::memcmp(header.magic, kTokenFileMagic, sizeof(header.magic)) == 0,
                "{} is not a shardlm token file (bad magic; expected a file written by `shardlm prepare`)", path);
  check_token_header(path, "token file", header.format_version, kTokenFileFormatVersion, header.vocab_size,
                     header.token_bytes);
  const uint64_t payload = file_.size() - kTokenFileHeaderBytes;
  SHARDLM_CHECK(payload % header.token_bytes == 0 && payload / header.token_bytes == header.token_count,
                "token file {}: header says {} tokens ({} bytes after the header) but the file has {} bytes "
                "after the header (truncated or corrupt)",
                path, header.token_count, header.token_count * header.token_bytes, payload);
  count_ = static_cast<int64_t>(header.token_count);
  vocab_size_ = static_cast<int64_t>(header.vocab_size);
  token_bytes_ = static_cast<int>(header.token_bytes);
  tokens_ = file_.data() + kTokenFileHeaderBytes;

  const int64_t bad =
      token_bytes_ == 2
          ? first_token_at_or_above(reinterpret_cast<const uint16_t*>(tokens_), count_, header.vocab_size)
          : first_token_at_or_above(reinterpret_cast<const uint32_t*>(tokens_), count_, header.vocab_size);
  SHARDLM_CHECK(bad < 0, "token file {}: token {} at position {} is not below the vocab size {} (corrupt file)",
                path, bad < 0 ? 0 : static_cast<uint64_t>((*this)[bad]), bad, vocab_size_);
}

void TokenFile::read(int64_t start, int64_t count, int32_t* out) const {
  SHARDLM_CHECK(start >= 0 && count >= 0 && start <= count_ - count,
                "token file {}: cannot read tokens [{}, {}) of {}", path_, start, start + count, count_);
  if (token_bytes_ == 2) {
    const auto* src = reinterpret_cast<const uint16_t*>(tokens_) + start;
    for (int64_t i = 0; i < count; ++i) out[i] = src[i];
  } else {
    const auto* src = reinterpret_cast<const uint32_t*>(tokens_) + start;
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(src[i]);
  }
}

}  // namespace shardlm
