// Checkpoints in model space (DESIGN.md "Lessons from the field").
//
// A checkpoint is a directory `RUN_DIR/checkpoints/step_NNNNNNNN/` holding
// manifest.json and one file per rank with that rank's owned slices of fp32 master
// weights and AdamW moments. The manifest records every tensor's name, unit, offset
// and shape and every shard's element ranges, so a reader can fetch any tensor's
// elements whatever layout (world size, strategy) wrote them. Commit is atomic:
// write into a temporary directory, fsync, rename, then move the `latest` pointer.
// Format: docs/checkpoint-format.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/strategy.hpp"

namespace shardlm {

inline constexpr int kCheckpointFormatVersion = 1;

// Which of the three per-element states to read.
enum class StateKind : int { master = 0, adam_m = 1, adam_v = 2 };

// Everything a resume needs besides the tensors.
struct CheckpointInfo {
  int64_t step = 0;         // steps completed
  int64_t tokens_seen = 0;
  ModelConfig model;
  std::string tokenizer;    // tokenizer spec ("byte", "gpt2:DIR")
  std::string strategy;
  int world_size = 1;
  nlohmann::json train;     // training options that must match on resume, and RNG states
};

// Collective over `comm`: every rank whose strategy writes_checkpoint() writes its
// owned slices into a shared temporary directory; rank 0 writes the manifest and
// commits atomically, then prunes to the newest `keep` checkpoints (keep <= 0: keep
// all). A failure on any rank fails the save on every rank (Error) and leaves the
// previous checkpoint as `latest`. Returns the committed directory.
std::string save_checkpoint(const std::string& run_dir, const ParamLayout& layout,
                            Strategy& strategy, const CheckpointInfo& info, int keep,
                            Communicator& comm);

// The checkpoint `latest` points to in RUN_DIR/checkpoints, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);
// A path that is a checkpoint directory, or a run directory meaning its latest one.
std::string resolve_checkpoint_path(const std::string& path);
// Every committed checkpoint directory of RUN_DIR, newest step first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Reads a committed checkpoint: verifies the manifest and the shard files' sizes and
// checksums on open (Error naming the file otherwise).
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  const CheckpointInfo& info() const { return info_; }
  const std::string& dir() const { return dir_; }
  // Parameter names in canonical order, with shapes.
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors() const {
    return tensors_;
  }
  // Elements [begin, begin+count) of tensor `name`'s state `kind`.
  void read(const std::string& name, StateKind kind, int64_t begin, int64_t count,
            float* out) const;
  // Loads the strategy's owned slices (any layout) from this checkpoint.
  void load_into(const ParamLayout& layout, Strategy& strategy) const;
  // sha256 over the fp32 master weights of every tensor in canonical order.
  std::string weights_digest() const;
  // sha256 over the AdamW moments (m then v of every tensor, canonical order).
  std::string optimizer_digest() const;

 private:
  struct TensorLocation {
    int unit = 0;
    int64_t offset = 0;
    int64_t numel = 0;
  };
  struct ShardSlice {
    int unit = 0;
    int64_t begin = 0, end = 0;
    int64_t file_offset = 0;  // bytes; master, adam_m, adam_v follow each other
  };
  struct Shard {
    std::string path;
    std::vector<ShardSlice> slices;
  };
  std::string dir_;
  CheckpointInfo info_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors_;
  std::vector<std::pair<std::string, TensorLocation>> locations_;
  std::vector<Shard> shards_;
  const TensorLocation& locate(const std::string& name) const;
  void read_unit_range(int unit, StateKind kind, int64_t begin, int64_t count, float* out) const;
};

}  // namespace shardlm

namespace shardlm {

// For --resume: the newest checkpoint of RUN_DIR that opens and verifies. Each one
// skipped (corrupt, truncated, missing shard, unreadable manifest) is reported
// through `warn` with the reason. nullopt when RUN_DIR has no checkpoint at all;
// Error when it has some but none is valid.
std::unique_ptr<CheckpointReader> open_newest_valid_checkpoint(
    const std::string& run_dir, const std::function<void(const std::string&)>& warn);

}  // namespace shardlm
