#include "shardlm/data/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "shardlm/core/error.hpp"

namespace shardlm {

MappedFile::MappedFile(const std::string& path, std::string_view what, std::string_view expected, size_t min_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SHARDLM_CHECK(fd >= 0, "cannot open {} {}: {} (expected {})", what, path, std::strerror(errno), expected);
  struct stat st {};
  const int stat_rc = ::fstat(fd, &st);
  const int stat_errno = errno;
  if (stat_rc != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("cannot read {} {}: {} (expected a regular file: {})", what, path,
                            stat_rc != 0 ? std::strerror(stat_errno) : "not a regular file", expected));
  }
  const auto file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < min_bytes) {
    ::close(fd);
    throw Error(fmt::format("{} {} is {} (expected at least the {}-byte header of {})", what, path,
                            file_bytes == 0 ? std::string("empty") : fmt::format("only {} bytes", file_bytes),
                            min_bytes, expected));
  }
  mapping_ = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw Error(fmt::format("cannot memory-map {} {}: {}", what, path, std::strerror(mmap_errno)));
  }
  bytes_ = file_bytes;
}

MappedFile::~MappedFile() { close(); }

void MappedFile::close() {
  if (mapping_ != nullptr) ::munmap(mapping_, bytes_);
  mapping_ = nullptr;
  bytes_ = 0;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    close();
    mapping_ = std::exchange(other.mapping_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace shardlm
