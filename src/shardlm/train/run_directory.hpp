// What a training job may do with its run directory: own it (one job at a time), and
// which checkpoint in it to continue from (--resume, --resume-if-exists, neither).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/run_directory_lock.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

// Collective: rank 0 creates the run directory if needed, takes its lock for the job
// (core/run_directory_lock.hpp) and removes what killed saves left; every rank fails
// when it cannot (the holder's pid and host on rank 0). nullptr on the other ranks.
std::unique_ptr<RunDirectoryLock> lock_run_directory(const std::string& run_dir,
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
