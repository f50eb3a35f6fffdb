// The commit rule of a checkpoint directory (docs/checkpoint-format.md, "Commit and
// recovery"): a checkpoint is committed when its commit marker, written last, exists
// and records the sha256 of the manifest beside it. `checkpoints/latest` is only a
// hint for people and tools; no load depends on it.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

inline constexpr const char* kCommitMarkerName = "commit.json";

// "step_00000100": the directory name of the checkpoint after `step` steps.
std::string checkpoint_dir_name(int64_t step);

struct CommitMarker {
  int64_t step = 0;
  std::string manifest_sha256;
};

// Writes DIR/commit.json through a fsynced temporary file renamed into place.
void write_commit_marker(const std::string& dir, const CommitMarker& marker);
bool has_commit_marker(const std::string& dir);
// Error naming the file when it is missing (the checkpoint was never committed) or
// damaged.
CommitMarker read_commit_marker(const std::string& dir);

}  // namespace shardlm
