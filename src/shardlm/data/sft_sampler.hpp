// Which tokens each SFT training row sees (the data side of fine-tuning; the model
// side takes positions/key_begin through MicroBatch, model/model.hpp).
//
// An example of L tokens (SftExampleFile) gives n = min(L - 1, seq_len) positions:
// inputs tokens[0..n), targets tokens[1..n] where the mask says target, else
// kIgnoreIndex (-1). (Examples longer than seq_len + 1 tokens lose their tail;
// examples_longer_than_row() counts them.) A row has seq_len positions, each with
//   tokens[t]     the input token
//   targets[t]    the next token of its example, or -1 (not a target, or padding)
//   positions[t]  the position id, restarting at 0 for every example
//   key_begin[t]  the row-local index where t's example starts: attention of
//                 position t looks at keys [key_begin[t], t] only, so it never
//                 crosses into another example of the row
// The positions after a row's last example are padding: token pad_token, target
// -1, positions 0, 1, ... from the padding's start, key_begin = that start (one
// more "example" that attends only to itself and has no targets).
//
// Batching (SftBatching):
//   padded  one example per row: row r of epoch e is example perm_e[r]
//   packed  whole examples concatenated greedily into rows: the examples in the
//           order perm_e go into the current row while they fit, and the next row
//           starts with the first that does not ("next fit"; no example is split)
// perm_e is the same Fisher-Yates shuffle as BatchSampler's (epoch_permutation(),
// sampler.hpp), or the identity when shuffle is off (evaluation). Global row g of a
// run (counted from its start across epochs) is a pure function of (file, seq_len,
// batching, seed, g): never of rank or world size. A step's rows are split across
// ranks and micro-batches by BatchPartition exactly like BatchSampler's samples
// (sample index = row index).
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/data/sft_example_file.hpp"

namespace shardlm {

enum class SftBatching { padded, packed };

// Where fill() writes: four arrays of rows x seq_len int32 each, row-major.
struct SftBatch {
  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
  int32_t* positions = nullptr;
  int32_t* key_begin = nullptr;
};

struct SftSamplerOptions {
  int seq_len = 0;
  SftBatching batching = SftBatching::padded;
  uint64_t seed = 0;
  bool shuffle = true;     // false: examples in file order every epoch (evaluation)
  int32_t pad_token = 0;   // input token of padding positions (never a target)
};

// Holds a reference to `file`, which must outlive it. Caches the current epoch's
// order and rows (buffers tracked as MemCategory::other, grown once); not
// thread-safe.
class SftSampler {
 public:
  // Error when seq_len < 1, the file has no example, or pad_token is not below the
  // file's vocabulary size.
  SftSampler(const SftExampleFile& file, const SftSamplerOptions& options);

  const SftSamplerOptions& options() const { return options_; }
  // Rows in epoch `epoch` (padded: the number of examples; packed: depends on the
  // epoch's order).
  int64_t rows_in_epoch(int64_t epoch);
  // Rows of the epochs before `epoch` (the global row where `epoch` starts).
  int64_t rows_before_epoch(int64_t epoch);
  // Examples with more than seq_len + 1 tokens (their tail is never seen).
  int64_t examples_longer_than_row() const { return examples_longer_than_row_; }

  // Fills row `row` of `batch` with global row `global_row` (>= 0); returns the
  // number of targets (!= -1) in it.
  int64_t fill(int64_t global_row, const SftBatch& batch, int64_t row);
  // Global rows [first, first + count) into rows 0..count-1 of `batch`; returns the
  // targets in them (for the loss normalization: sum over a step's micro-batches and
  // ranks).
  int64_t fill_batch(int64_t first_global_row, int64_t count, const SftBatch& batch);
  // The examples global row `global_row` holds, in order.
  std::vector<int64_t> examples_of(int64_t global_row);

 private:
  void load_epoch(int64_t epoch);
  // (epoch, row within it) of a global row.
  std::pair<int64_t, int64_t> locate(int64_t global_row);
  int64_t positions_of(int64_t example) const;

  const SftExampleFile* file_;
  SftSamplerOptions options_;
  int64_t examples_longer_than_row_ = 0;
  int64_t cached_epoch_ = -1;
  TrackedBuffer order_;       // int64_t[examples]: perm_e
  TrackedBuffer row_starts_;  // int64_t[rows + 1]: row r holds order_[row_starts[r] .. row_starts[r + 1])
  int64_t cached_rows_ = 0;
  std::vector<int64_t> epoch_rows_;  // rows of epochs 0, 1, ... computed so far
};

}  // namespace shardlm
