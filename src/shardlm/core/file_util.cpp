#include "shardlm/core/file_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "shardlm/core/error.hpp"
#include "shardlm/core/fault_injection.hpp"

namespace shardlm {

File File::open_read(const std::string& path, std::string_view expected) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) {
    const std::string reason = std::strerror(errno);
    throw Error(expected.empty()
                    ? fmt::format("cannot read '{}': {}", path, reason)
                    : fmt::format("cannot read '{}': {} (expected {})", path, reason, expected));
  }
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
    const ssize_t n = disk_full_injected(path_) ? (errno = ENOSPC, -1) : ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    SHARDLM_CHECK(n > 0, "cannot write '{}': {}", path_, std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void File::write_zeros(size_t bytes) {
  const off_t at = ::lseek(fd_, 0, SEEK_CUR);
  SHARDLM_CHECK(at >= 0, "cannot seek in '{}': {}", path_, std::strerror(errno));
  const off_t end = at + static_cast<off_t>(bytes);
  // A hole: the file reads back zeros there and takes no disk space for them.
  SHARDLM_CHECK(::ftruncate(fd_, std::max<off_t>(end, static_cast<off_t>(size()))) == 0,
                "cannot write '{}': {}", path_, std::strerror(errno));
  SHARDLM_CHECK(::lseek(fd_, end, SEEK_SET) == end, "cannot seek in '{}': {}", path_,
                std::strerror(errno));
}

void File::write_at(const void* data, size_t bytes, int64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n =
        disk_full_injected(path_) ? (errno = ENOSPC, -1) : ::pwrite(fd_, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    SHARDLM_CHECK(n > 0, "cannot write '{}': {}", path_, std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += n;
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

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)),
      temp_path_(path_ + ".tmp." + std::to_string(::getpid())),
      file_(File::create_write(temp_path_)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (committed_) return;
  file_ = File();  // closes without the error check of close()
  ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::finish() {
  if (finished_) return;
  file_.sync();
  file_.close();
  finished_ = true;
}

void AtomicFileWriter::commit() {
  finish();
  SHARDLM_CHECK(std::rename(temp_path_.c_str(), path_.c_str()) == 0,
                "cannot rename '{}' to '{}': {}", temp_path_, path_, std::strerror(errno));
  committed_ = true;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

std::vector<std::string> create_directories_reporting(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> created;
  std::error_code ec;
  const fs::path target = fs::absolute(dir).lexically_normal();
  for (fs::path p = target; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    created.insert(created.begin(), p.string());
    if (p == p.parent_path()) break;
  }
  fs::create_directories(target, ec);
  SHARDLM_CHECK(!ec && fs::is_directory(target), "cannot create directory '{}': {}", dir,
                ec ? ec.message() : "a file with that name exists");
  return created;
}

void remove_created_directories(const std::vector<std::string>& created) {
  std::error_code ec;
  for (auto it = created.rbegin(); it != created.rend(); ++it)
    if (!std::filesystem::remove(*it, ec)) return;  // not empty (or gone): stop here
}

namespace {

// The PID a temporary's name ends in (".tmp.PID" or "-tmp-PID"), if it has one.
std::optional<pid_t> temporary_owner(const std::string& name) {
  for (const std::string_view mark : {".tmp.", "-tmp-"}) {
    const size_t at = name.rfind(mark);
    if (at == std::string::npos || at + mark.size() >= name.size()) continue;
    const std::string digits = name.substr(at + mark.size());
    if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    return static_cast<pid_t>(std::stol(digits));
  }
  return std::nullopt;
}

bool process_runs(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

std::vector<std::string> remove_temporaries_of_dead_processes(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto owner = temporary_owner(entry.path().filename().string());
    if (!owner || *owner == ::getpid() || process_runs(*owner)) continue;
    std::error_code remove_ec;
    std::filesystem::remove_all(entry.path(), remove_ec);
    if (!remove_ec) removed.push_back(entry.path().string());
  }
  return removed;
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFileWriter writer(path);
  writer.write(content.data(), content.size());
  writer.commit();
}

std::string read_text_file(const std::string& path, std::string_view expected) {
  File f = File::open_read(path, expected);
  std::string content(static_cast<size_t>(f.size()), '\0');
  if (!content.empty()) f.read_at(content.data(), content.size(), 0);
  return content;
}

}  // namespace shardlm
