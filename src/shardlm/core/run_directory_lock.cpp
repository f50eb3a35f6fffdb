#include "shardlm/core/run_directory_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

std::string holder_description() {
  char host[256] = "unknown";
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32] = "";
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return fmt::format("pid {} on host {} since {}", ::getpid(), host, when);
}

std::string read_holder(int fd) {
  char text[512] = {};
  const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? "holder unknown" : holder;
}

}  // namespace

std::unique_ptr<RunDirectoryLock> RunDirectoryLock::acquire(const std::string& run_dir) {
  SHARDLM_CHECK(!run_dir.empty(), "--out is required (the run directory)");
  return acquire_for(run_dir, kFileName, "");
}

std::unique_ptr<RunDirectoryLock> RunDirectoryLock::acquire_for(const std::string& run_dir,
                                                                const std::string& file_name,
                                                                const std::string& job) {
  std::unique_ptr<RunDirectoryLock> lock(new RunDirectoryLock());
  lock->file_name_ = file_name;
  lock->remove_file_on_release_ = !job.empty();
  lock->dir_ = fs::absolute(run_dir).lexically_normal();
  try {
    lock->created_ = create_directories_reporting(run_dir);
  } catch (const Error& e) {
    throw Error(fmt::format("run directory: {}", e.what()));
  }
  const std::string path = (lock->dir_ / file_name).string();
  lock->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock->fd_ < 0) {
    const std::string reason = std::strerror(errno);
    remove_created_directories(lock->created_);
    throw Error(fmt::format("cannot open the run directory's lock file '{}': {}", path, reason));
  }
  if (::flock(lock->fd_, LOCK_EX | LOCK_NB) != 0) {
    const bool busy = errno == EWOULDBLOCK;
    const std::string reason = busy ? read_holder(lock->fd_) : std::strerror(errno);
    ::close(lock->fd_);
    lock->fd_ = -1;
    SHARDLM_CHECK(!busy || !lock->remove_file_on_release_,
                  "'{}' is in use by another {} ({}; lock file {}); wait for it to end or choose "
                  "another --out",
                  run_dir, job, reason, path);
    SHARDLM_CHECK(!busy,
                  "run directory '{}' is in use by another job ({}; lock file {}); wait for it "
                  "to end or choose another --out",
                  run_dir, reason, path);
    throw Error(fmt::format("cannot lock '{}': {}", path, reason));
  }
  const std::string holder = holder_description() + "\n";
  const bool recorded = ::ftruncate(lock->fd_, 0) == 0 &&
                        ::pwrite(lock->fd_, holder.data(), holder.size(), 0) ==
                            static_cast<ssize_t>(holder.size());
  SHARDLM_CHECK(recorded, "cannot write the run directory's lock file '{}': {}", path,
                std::strerror(errno));
  return lock;
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ < 0) return;
  std::error_code ec;
  if (remove_file_on_release_) fs::remove(dir_ / file_name_, ec);  // while still holding it
  if (!created_.empty()) {
    bool only_lock = true;
    for (const auto& entry : fs::directory_iterator(dir_, ec))
      only_lock = only_lock && entry.path().filename() == file_name_;
    if (!ec && only_lock) {
      fs::remove(dir_ / file_name_, ec);
      remove_created_directories(created_);
    }
  }
  ::close(fd_);  // releases the flock
}

}  // namespace shardlm
