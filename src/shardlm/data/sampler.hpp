// Which tokens each training sample sees. The token stream is cut into windows
// of seq_len + 1 tokens starting at multiples of seq_len (window w covers
// tokens [w*seq_len, w*seq_len + seq_len]; inputs are its first seq_len tokens,
// targets its last seq_len). Sample g of the run is a pure function of (seed,
// g), never of rank or world size:
//   n = number of windows, epoch = g / n,
//   window(g) = perm_epoch[g % n], perm_epoch = Fisher-Yates shuffle of 0..n-1
//   driven by Rng(epoch_seed(seed, epoch)).
// Step s of a run with global batch G uses samples [s*G, (s+1)*G);
// BatchPartition says which of those a rank takes per micro-batch.
#pragma once

#include <cstdint>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/data/token_file.hpp"

namespace shardlm {

// The seed of epoch `epoch`'s shuffle: splitmix64(splitmix64(seed) ^ epoch).
uint64_t epoch_seed(uint64_t seed, int64_t epoch);

// perm[0..n) = epoch `epoch`'s order of n items: the Fisher-Yates shuffle of
// 0..n-1 (i from n-1 down to 1 swaps with Rng::below(i+1)) driven by
// Rng(epoch_seed(seed, epoch)). BatchSampler's windows and SftSampler's examples.
void epoch_permutation(uint64_t seed, int64_t epoch, int64_t* perm, int64_t n);

// Number of windows of seq_len + 1 tokens; Error naming the file when there
// is not even one ("has N tokens, fewer than seq_len+1 = M").
int64_t count_windows(const TokenFile& file, int seq_len);

// Training samples, shuffled per epoch. Holds a reference to `file`, which
// must outlive it. Caches the current epoch's permutation (one buffer,
// allocated once); not thread-safe.
class BatchSampler {
 public:
  BatchSampler(const TokenFile& file, int seq_len, uint64_t seed);

  int64_t num_windows() const { return num_windows_; }
  int seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }

  // The window that global sample `global_sample_index` (>= 0) reads.
  int64_t window_of(int64_t global_sample_index);
  // tokens[0..seq_len) = the sample's inputs, targets[0..seq_len) = the same
  // window shifted by one.
  void fill(int64_t global_sample_index, int32_t* tokens, int32_t* targets);
  // Samples [first, first + count) into count * seq_len tokens and targets, row-major.
  void fill_batch(int64_t first_global_sample_index, int64_t count, int32_t* tokens, int32_t* targets);

 private:
  void load_epoch(int64_t epoch);

  const TokenFile* file_;
  int seq_len_;
  uint64_t seed_;
  int64_t num_windows_;
  int64_t cached_epoch_ = -1;
  TrackedBuffer permutation_;  // int64_t[num_windows_]
};

// Evaluation samples: window i of the file, in order (no shuffle), so every
// evaluation of a run sees the same first K windows, whatever the world size.
// Split an evaluation pass over ranks with BatchPartition (step = eval batch
// index, sample index = window index).
class EvalSampler {
 public:
  EvalSampler(const TokenFile& file, int seq_len);
  int64_t num_windows() const { return num_windows_; }
  int seq_len() const { return seq_len_; }
  // Error if window_index is outside [0, num_windows()).
  void fill(int64_t window_index, int32_t* tokens, int32_t* targets) const;

 private:
  const TokenFile* file_;
  int seq_len_;
  int64_t num_windows_;
};

// How one step's global batch of G samples is split: rank r of N takes the
// contiguous slice [s*G + r*G/N, s*G + (r+1)*G/N) of step s, in
// accumulation_steps() = G / (N*b) micro-batches of b samples each.
class BatchPartition {
 public:
  // Error naming both numbers when G is not a multiple of N*b (or any is < 1).
  BatchPartition(int64_t global_batch, int world_size, int64_t micro_batch);

  int64_t global_batch() const { return global_batch_; }
  int world_size() const { return world_size_; }
  int64_t micro_batch() const { return micro_batch_; }
  int64_t samples_per_rank() const { return global_batch_ / world_size_; }
  int accumulation_steps() const { return static_cast<int>(global_batch_ / (world_size_ * micro_batch_)); }

  // Global sample index of the first sample of micro-batch `micro_step` of
  // `rank` at `step`; that micro-batch is [first, first + micro_batch()).
  int64_t first_sample(int64_t step, int rank, int micro_step) const;

 private:
  int64_t global_batch_;
  int world_size_;
  int64_t micro_batch_;
};

}  // namespace shardlm
