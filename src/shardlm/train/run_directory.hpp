// What a training job may do with its run directory: own it (one job at a time), and
// which checkpoint in it to continue from (--resume, --resume-if-exists, neither).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/run_directory_lock.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

// Rank 0's hold on a run directory for one job: its lock, and the paths the job wrote
// there, so that a job which fails before the directory holds a committed checkpoint
// takes back what it wrote (a disk that fills at the first save leaves no config.json,
// metrics.jsonl or data behind, only what was there before).
class RunDirectoryClaim {
 public:
  RunDirectoryClaim(std::unique_ptr<RunDirectoryLock> lock, std::string run_dir)
      : lock_(std::move(lock)), run_dir_(std::move(run_dir)) {}
  // `path` (a file or a directory) is this job's: call it before the first write, and
  // only for a path that did not exist or that the job replaces whole.
  void wrote(const std::string& path);
  // For a job that fails: when the directory holds no committed checkpoint, removes
  // what the job wrote (the paths noted, newest first; then `checkpoints` if nothing is
  // left in it) and returns the noted paths it removed. Nothing when it holds one.
  std::vector<std::string> discard_if_uncommitted();

 private:
  std::unique_ptr<RunDirectoryLock> lock_;  // released last: the lock file goes after the rest
  std::string run_dir_;
  std::vector<std::string> written_;
};

// Collective: rank 0 creates the run directory if needed, takes its lock for the job
// (core/run_directory_lock.hpp) and removes what killed saves left; every rank fails
// when it cannot (the holder's pid and host on rank 0). nullptr on the other ranks.
std::unique_ptr<RunDirectoryClaim> lock_run_directory(const std::string& run_dir,
                                                      Communicator& comm);

// Writes a run's data directory (RUN/data) whole or not at all, under the run
// directory's lock: `write` fills a fresh temporary directory beside it
// (DATA_DIR.preparing; one a killed job left is removed first), which is renamed to
// DATA_DIR when `write` returns. On an Error the temporary is removed and DATA_DIR is
// not touched. Error when DATA_DIR already exists.
void write_run_data(const std::string& data_dir,
                    const std::function<void(const std::string& temporary_dir)>& write);

// The checkpoint a run continues from, by the recovery rule (checkpoint.hpp):
//  neither flag: none; Error if the directory already holds checkpoints (another run);
//  --resume: the newest valid one; Error when the directory has none committed;
//  --resume-if-exists: the newest valid one, or nullptr when none was committed.
// Committed checkpoints that all fail verification are an Error under either flag,
// never a fresh start.
std::unique_ptr<CheckpointReader> checkpoint_to_resume(const TrainOptions& options,
                                                       const CheckpointWarning& warn);

}  // namespace shardlm
