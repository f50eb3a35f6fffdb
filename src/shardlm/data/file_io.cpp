#include "shardlm/data/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardlm/core/error.hpp"

namespace shardlm::data_io {

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  temp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SHARDLM_CHECK(fd_ >= 0, "cannot create {}: {}", temp_path_, std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  SHARDLM_ASSERT(fd_ >= 0);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    SHARDLM_CHECK(n > 0, "cannot write {}: {}", temp_path_, std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::write_at(const void* data, size_t bytes, size_t offset) {
  SHARDLM_ASSERT(fd_ >= 0);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    SHARDLM_CHECK(n > 0, "cannot write {}: {}", temp_path_, std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::finish() {
  SHARDLM_ASSERT(fd_ >= 0);
  SHARDLM_CHECK(::fsync(fd_) == 0, "cannot write {}: fsync failed: {}", temp_path_, std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  SHARDLM_CHECK(rc == 0, "cannot write {}: close failed: {}", temp_path_, std::strerror(errno));
}

void AtomicFileWriter::commit() {
  if (fd_ >= 0) finish();
  SHARDLM_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, "cannot rename {} to {}: {}", temp_path_,
                path_, std::strerror(errno));
  committed_ = true;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  // Make the rename itself durable; failure here loses nothing already written.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomically(const std::string& path, const void* data, size_t bytes) {
  AtomicFileWriter writer(path);
  writer.write(data, bytes);
  writer.commit();
}

std::string read_whole_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  SHARDLM_CHECK(in.good(), "cannot read {}: {} (expected {})", path, std::strerror(errno), what);
  std::ostringstream content;
  content << in.rdbuf();
  SHARDLM_CHECK(!in.bad(), "cannot read {}: read error (expected {})", path, what);
  return content.str();
}

}  // namespace shardlm::data_io
