#include "shardlm/core/file_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "shardlm/core/error.hpp"

namespace shardlm {

File File::open_read(const std::string& path) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SHARDLM_CHECK(f.fd_ >= 0, "cannot open '{}' for reading: {}", path, std::strerror(errno));
  return f;
}

File File::create_write(const std::string& path) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SHARDLM_CHECK(f.fd_ >= 0, "cannot create '{}': {}", path, std::strerror(errno));
  return f;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

void File::write_all(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    SHARDLM_CHECK(n > 0, "cannot write '{}': {}", path_, std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void File::read_at(void* out, size_t bytes, int64_t offset) const {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t n = ::pread(fd_, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    SHARDLM_CHECK(n > 0, "cannot read {} bytes at offset {} of '{}': {}", bytes, offset, path_,
                  n == 0 ? "file is truncated" : std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += n;
  }
}

void File::sync() {
  SHARDLM_CHECK(::fsync(fd_) == 0, "cannot fsync '{}': {}", path_, std::strerror(errno));
}

int64_t File::size() const {
  struct stat st {};
  SHARDLM_CHECK(::fstat(fd_, &st) == 0, "cannot stat '{}': {}", path_, std::strerror(errno));
  return st.st_size;
}

void File::close() {
  if (fd_ >= 0) {
    int rc = ::close(fd_);
    fd_ = -1;
    SHARDLM_CHECK(rc == 0, "cannot close '{}': {}", path_, std::strerror(errno));
  }
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  SHARDLM_CHECK(fd >= 0, "cannot open directory '{}': {}", dir, std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  SHARDLM_CHECK(rc == 0, "cannot fsync directory '{}': {}", dir, std::strerror(errno));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    File f = File::create_write(tmp);
    f.write_all(content.data(), content.size());
    f.sync();
    f.close();
  }
  SHARDLM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '{}' to '{}': {}", tmp,
                path, std::strerror(errno));
  auto parent = std::filesystem::path(path).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

std::string read_text_file(const std::string& path) {
  File f = File::open_read(path);
  std::string content(static_cast<size_t>(f.size()), '\0');
  if (!content.empty()) f.read_at(content.data(), content.size(), 0);
  return content;
}

}  // namespace shardlm
