// Checkpoints in model space (docs/checkpoint-format.md).
//
// A checkpoint is a directory `RUN_DIR/checkpoints/step_NNNNNNNN/` holding
// manifest.json, one file per writing rank with that rank's owned slices of fp32
// master weights and AdamW moments, and the commit marker commit.json. The manifest
// records every tensor's name, unit, offset and shape and every shard's element
// ranges, so a reader can fetch any tensor's elements whatever layout (world size,
// strategy) wrote them. A save writes into a temporary directory, fsyncs, renames it,
// and commits by writing the marker, which holds the manifest's sha256; the shards'
// sha256 are in the manifest, so every byte a load depends on is checked before the
// load. Format and recovery rule: docs/checkpoint-format.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/ckpt/checkpoint_manifest.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/owned_state.hpp"

namespace shardlm {

// Which of the three per-element states to read.
enum class StateKind : int { master = 0, adam_m = 1, adam_v = 2 };

// Collective over `comm`: every rank whose state writes_checkpoint() writes its
// owned slices into a shared temporary directory; rank 0 checks that every writing
// rank left its shard and its sidecar and that together they store every element,
// writes the manifest and commits, then prunes to the newest `keep` committed
// checkpoints (keep <= 0: keep all). Temporary directories left by interrupted saves
// are removed first. A failure on any rank fails the save on every rank (Error) and
// leaves no new checkpoint. Returns the committed directory.
std::string save_checkpoint(const std::string& run_dir, const ParamLayout& layout,
                            OwnedState& state, const CheckpointInfo& info, int keep,
                            Communicator& comm);

// Removes what saves killed midway left in RUN_DIR/checkpoints (temporary checkpoint
// directories and pointer files). Only for the job holding the run directory's lock:
// no other job is saving then.
void remove_interrupted_saves(const std::string& run_dir);

// Every step_* directory of RUN_DIR/checkpoints, committed or not, newest step first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Opens a committed checkpoint after verifying it completely: the commit marker, the
// manifest against the marker's sha256, every field of the manifest
// (checkpoint_manifest.hpp), and every shard's size and sha256. Error naming the file
// otherwise; nothing is read from a checkpoint that fails.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  const CheckpointInfo& info() const { return manifest_.info; }
  const std::string& dir() const { return dir_; }
  // Parameter names in canonical order, with shapes.
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors() const {
    return tensors_;
  }
  // Elements [begin, begin+count) of tensor `name`'s state `kind` (the logical tensor's
  // row-major elements, an NF4 tensor's storage words: a tensor-parallel checkpoint's
  // pieces are put together, NF4 pieces block by block).
  void read(const std::string& name, StateKind kind, int64_t begin, int64_t count,
            float* out) const;
  // Loads the owned slices (any layout) from this checkpoint.
  void load_into(const ParamLayout& layout, OwnedState& state) const;
  // sha256 over the fp32 master weights of every tensor in canonical order.
  std::string weights_digest() const;
  // sha256 over the AdamW moments (m then v of every tensor, canonical order).
  std::string optimizer_digest() const;

 private:
  // The entries of tensor `name`: one, or one piece per tensor rank (Error if none).
  std::vector<const ManifestTensor*> locate(const std::string& name) const;
  // Elements [begin, begin + count) of `piece` (a layout's parameter) from the tensor.
  void read_piece(const ParamInfo& piece, StateKind kind, int64_t begin, int64_t count,
                  float* out) const;
  // Elements tensor `name` stores (an NF4 tensor's words; pieces: the whole tensor's).
  int64_t stored_numel(const std::string& name) const;
  void read_unit_range(int unit, StateKind kind, int64_t begin, int64_t count, float* out) const;

  std::string dir_;
  CheckpointManifest manifest_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors_;
};

// Receives one line per checkpoint passed over (never committed, damaged, ...).
using CheckpointWarning = std::function<void(const std::string&)>;
// Prints "warning: <line>" on stderr.
void print_checkpoint_warning(const std::string& line);

// The recovery rule (--resume, launch restarts, commands given a run directory): the
// newest checkpoint of RUN_DIR that is committed and verifies completely. Each one
// passed over is reported through `warn` with the reason. nullptr when RUN_DIR has
// no committed checkpoint; Error when it has committed ones but none is valid.
std::unique_ptr<CheckpointReader> open_newest_valid_checkpoint(const std::string& run_dir,
                                                               const CheckpointWarning& warn);

// PATH is a checkpoint directory (holding manifest.json), or a run directory meaning
// its newest valid checkpoint. Error when it is neither.
std::unique_ptr<CheckpointReader> open_checkpoint(const std::string& path,
                                                  const CheckpointWarning& warn);

}  // namespace shardlm
