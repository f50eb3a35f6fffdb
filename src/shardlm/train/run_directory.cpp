#include "shardlm/train/run_directory.hpp"

#include <algorithm>
#include <filesystem>

#include "shardlm/ckpt/checkpoint_commit.hpp"
#include "shardlm/comm/on_all_ranks.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"

namespace fs = std::filesystem;

namespace shardlm {

void RunDirectoryClaim::wrote(const std::string& path) {
  if (std::find(written_.begin(), written_.end(), path) == written_.end()) written_.push_back(path);
}

std::vector<std::string> RunDirectoryClaim::discard_if_uncommitted() {
  for (const std::string& checkpoint : list_checkpoints(run_dir_))
    if (has_commit_marker(checkpoint)) return {};
  std::vector<std::string> removed;
  std::error_code ec;
  for (auto it = written_.rbegin(); it != written_.rend(); ++it)
    if (fs::remove_all(*it, ec) > 0 && !ec) removed.push_back(*it);
  // A failed save removed its own temporary; the directory it went into is the run's.
  const fs::path checkpoints = fs::path(run_dir_) / "checkpoints";
  if (fs::is_directory(checkpoints, ec) && fs::is_empty(checkpoints, ec)) fs::remove(checkpoints, ec);
  written_.clear();
  return removed;
}

std::unique_ptr<RunDirectoryClaim> lock_run_directory(const std::string& run_dir,
                                                      Communicator& comm) {
  std::unique_ptr<RunDirectoryClaim> claim;
  on_all_ranks(comm, "taking the run directory's lock", [&] {
    if (comm.rank() != 0) return;
    claim = std::make_unique<RunDirectoryClaim>(RunDirectoryLock::acquire(run_dir), run_dir);
    remove_interrupted_saves(run_dir);  // the lock says no other job is saving
  });
  return claim;
}

void write_run_data(const std::string& data_dir,
                    const std::function<void(const std::string& temporary_dir)>& write) {
  const fs::path target = fs::path(data_dir).lexically_normal();
  SHARDLM_CHECK(!fs::exists(target), "'{}' exists already (expected it absent before preparing it)",
                data_dir);
  const fs::path temporary = target.string() + ".preparing";
  std::error_code ec;
  fs::remove_all(temporary, ec);
  SHARDLM_CHECK(!ec, "cannot remove '{}' (left by an interrupted preparation): {}",
                temporary.string(), ec.message());
  try {
    write(temporary.string());
    fs::rename(temporary, target);
  } catch (const std::exception&) {
    fs::remove_all(temporary, ec);
    throw;
  }
  fsync_directory(target.parent_path().string());
}

std::unique_ptr<CheckpointReader> checkpoint_to_resume(const TrainOptions& o,
                                                       const CheckpointWarning& warn) {
  if (!o.resume && !o.resume_if_exists) {
    const auto existing = list_checkpoints(o.out_dir);
    SHARDLM_CHECK(existing.empty(),
                  "run directory '{}' already holds a run (checkpoint '{}'); pass --resume to "
                  "continue it or choose another --out",
                  o.out_dir, existing.empty() ? "" : existing.front());
    return nullptr;
  }
  auto checkpoint = open_newest_valid_checkpoint(o.out_dir, warn);
  SHARDLM_CHECK(checkpoint != nullptr || !o.resume,
                "--resume: run directory '{}' holds no committed checkpoint to continue from "
                "(check --out; --resume-if-exists starts a new run when there is none)",
                o.out_dir);
  return checkpoint;
}

}  // namespace shardlm
