// RunDirectoryLock: one job per run directory. An exclusive flock on RUN_DIR/run.lock,
// held for the life of the object; the kernel drops it when the process ends, however
// it ends, so a killed job never leaves a stale lock. The file records who holds it
// (pid, host, start time) for the error a second job gets.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace shardlm {

class RunDirectoryLock {
 public:
  static constexpr const char* kFileName = "run.lock";

  // Creates RUN_DIR (and missing parents) if needed and takes the lock. Error naming
  // the holder ("pid 1234 on host h since ...") when another job holds it; then
  // nothing this call created is left behind.
  static std::unique_ptr<RunDirectoryLock> acquire(const std::string& run_dir);
  // The same lock for another kind of job on a directory (an export into OUT): its own
  // lock file name, the job named in the error, and the lock file removed on release
  // (so a finished export leaves only what it wrote; a job that finds no lock file
  // creates a new one, and checks the directory's contents under it).
  static std::unique_ptr<RunDirectoryLock> acquire_for(const std::string& dir, const std::string& file_name,
                                                       const std::string& job);
  // Releases the lock. If acquire() created the directory and it holds nothing but
  // the lock file (the job failed before writing anything), removes what it created.
  ~RunDirectoryLock();
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

 private:
  RunDirectoryLock() = default;
  int fd_ = -1;
  std::filesystem::path dir_;
  std::string file_name_ = kFileName;
  bool remove_file_on_release_ = false;
  std::vector<std::string> created_;  // directories acquire() made, outermost first
};

}  // namespace shardlm
