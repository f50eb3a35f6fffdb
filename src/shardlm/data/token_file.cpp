#include "shardlm/data/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>
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

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SHARDLM_CHECK(fd >= 0, "cannot open token file {}: {} (expected a file written by `shardlm prepare`)", path,
                std::strerror(errno));
  struct stat st {};
  const int stat_rc = ::fstat(fd, &st);
  const int stat_errno = errno;
  if (stat_rc != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("cannot read token file {}: {} (expected a regular file written by `shardlm prepare`)",
                            path, stat_rc != 0 ? std::strerror(stat_errno) : "not a regular file"));
  }
  const auto file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    throw Error(fmt::format("token file {} is {} (expected at least the {}-byte header of a shardlm token file)",
                            path, file_bytes == 0 ? std::string("empty") : fmt::format("only {} bytes", file_bytes),
                            kTokenFileHeaderBytes));
  }
  mapping_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw Error(fmt::format("cannot memory-map token file {}: {}", path, std::strerror(mmap_errno)));
  }
  mapping_bytes_ = static_cast<size_t>(file_bytes);

  try {
    TokenFileHeader header;
    std::memcpy(&header, mapping_, sizeof(header));
    SHARDLM_CHECK(std::memcmp(header.magic, kTokenFileMagic, sizeof(header.magic)) == 0,
                  "{} is not a shardlm token file (bad magic; expected a file written by `shardlm prepare`)", path);
    SHARDLM_CHECK(header.format_version >= 1 && header.format_version <= kTokenFileFormatVersion,
                  "token file {} has format version {} (this build reads versions 1..{}; a newer shardlm wrote it)",
                  path, header.format_version, kTokenFileFormatVersion);
    SHARDLM_CHECK(header.vocab_size >= 1 && header.vocab_size <= (uint64_t{1} << 31),
                  "token file {}: vocab size {} in the header (expected 1..2^31)", path, header.vocab_size);
    const int expected_bytes = token_bytes_for_vocab(static_cast<int64_t>(header.vocab_size));
    SHARDLM_CHECK(header.token_bytes == static_cast<uint32_t>(expected_bytes),
                  "token file {}: {}-byte tokens in the header (expected {} for vocab size {})", path,
                  header.token_bytes, expected_bytes, header.vocab_size);
    const uint64_t payload = mapping_bytes_ - kTokenFileHeaderBytes;
    SHARDLM_CHECK(payload % header.token_bytes == 0 && payload / header.token_bytes == header.token_count,
                  "token file {}: header says {} tokens ({} bytes after the header) but the file has {} bytes "
                  "after the header (truncated or corrupt)",
                  path, header.token_count, header.token_count * header.token_bytes, payload);
    count_ = static_cast<int64_t>(header.token_count);
    vocab_size_ = static_cast<int64_t>(header.vocab_size);
    token_bytes_ = expected_bytes;
    tokens_ = static_cast<const unsigned char*>(mapping_) + kTokenFileHeaderBytes;

    const int64_t bad =
        token_bytes_ == 2
            ? first_token_at_or_above(reinterpret_cast<const uint16_t*>(tokens_), count_, header.vocab_size)
            : first_token_at_or_above(reinterpret_cast<const uint32_t*>(tokens_), count_, header.vocab_size);
    SHARDLM_CHECK(bad < 0, "token file {}: token {} at position {} is not below the vocab size {} (corrupt file)",
                  path, bad < 0 ? 0 : static_cast<uint64_t>((*this)[bad]), bad, vocab_size_);
  } catch (...) {
    close();
    throw;
  }
}

TokenFile::~TokenFile() { close(); }

void TokenFile::close() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  mapping_bytes_ = 0;
  tokens_ = nullptr;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      vocab_size_(other.vocab_size_),
      token_bytes_(other.token_bytes_) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
    vocab_size_ = other.vocab_size_;
    token_bytes_ = other.token_bytes_;
  }
  return *this;
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
