#include "shardlm/data/sampler.hpp"

#include <utility>

#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"

namespace shardlm {
namespace {

// Window w: inputs are tokens [w*T, w*T + T), targets [w*T + 1, w*T + T + 1).
void fill_window(const TokenFile& file, int seq_len, int64_t window, int32_t* tokens, int32_t* targets) {
  const int64_t start = window * seq_len;
  file.read(start, seq_len, tokens);
  for (int i = 0; i + 1 < seq_len; ++i) targets[i] = tokens[i + 1];
  targets[seq_len - 1] = file[start + seq_len];
}

}  // namespace

uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  return splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch));
}

int64_t count_windows(const TokenFile& file, int seq_len) {
  SHARDLM_CHECK(seq_len >= 1, "sequence length {} (expected at least 1)", seq_len);
  const int64_t windows = file.size() > 0 ? (file.size() - 1) / seq_len : 0;
  SHARDLM_CHECK(windows > 0, "data file {} has {} tokens, fewer than seq_len+1 = {}", file.path(), file.size(),
                int64_t{seq_len} + 1);
  return windows;
}

BatchSampler::BatchSampler(const TokenFile& file, int seq_len, uint64_t seed)
    : file_(&file),
      seq_len_(seq_len),
      seed_(seed),
      num_windows_(count_windows(file, seq_len)),
      permutation_(MemCategory::other, static_cast<size_t>(num_windows_) * sizeof(int64_t)) {}

void epoch_permutation(uint64_t seed, int64_t epoch, int64_t* perm, int64_t n) {
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  Rng rng(epoch_seed(seed, epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
}

void BatchSampler::load_epoch(int64_t epoch) {
  epoch_permutation(seed_, epoch, permutation_.as<int64_t>(), num_windows_);
  cached_epoch_ = epoch;
}

int64_t BatchSampler::window_of(int64_t global_sample_index) {
  SHARDLM_CHECK(global_sample_index >= 0, "global sample index {} (expected >= 0)", global_sample_index);
  const int64_t epoch = global_sample_index / num_windows_;
  if (epoch != cached_epoch_) load_epoch(epoch);
  return permutation_.as<int64_t>()[global_sample_index % num_windows_];
}

void BatchSampler::fill(int64_t global_sample_index, int32_t* tokens, int32_t* targets) {
  fill_window(*file_, seq_len_, window_of(global_sample_index), tokens, targets);
}

void BatchSampler::fill_batch(int64_t first_global_sample_index, int64_t count, int32_t* tokens, int32_t* targets) {
  for (int64_t i = 0; i < count; ++i)
    fill(first_global_sample_index + i, tokens + i * seq_len_, targets + i * seq_len_);
}

EvalSampler::EvalSampler(const TokenFile& file, int seq_len)
    : file_(&file), seq_len_(seq_len), num_windows_(count_windows(file, seq_len)) {}

void EvalSampler::fill(int64_t window_index, int32_t* tokens, int32_t* targets) const {
  SHARDLM_CHECK(window_index >= 0 && window_index < num_windows_,
                "evaluation window {} of data file {} (expected 0..{}: it has {} windows of {} tokens)", window_index,
                file_->path(), num_windows_ - 1, num_windows_, int64_t{seq_len_} + 1);
  fill_window(*file_, seq_len_, window_index, tokens, targets);
}

BatchPartition::BatchPartition(int64_t global_batch, int world_size, int64_t micro_batch)
    : global_batch_(global_batch), world_size_(world_size), micro_batch_(micro_batch) {
  SHARDLM_CHECK(global_batch >= 1 && world_size >= 1 && micro_batch >= 1,
                "global batch {}, world size {}, micro batch {} (expected each at least 1)", global_batch, world_size,
                micro_batch);
  SHARDLM_CHECK(global_batch % (int64_t{world_size} * micro_batch) == 0,
                "global batch {} is not divisible by world size x micro batch = {} x {} = {} (expected a multiple, "
                "so every rank runs the same number of micro-batches)",
                global_batch, world_size, micro_batch, int64_t{world_size} * micro_batch);
}

int64_t BatchPartition::first_sample(int64_t step, int rank, int micro_step) const {
  SHARDLM_CHECK(step >= 0 && rank >= 0 && rank < world_size_ && micro_step >= 0 && micro_step < accumulation_steps(),
                "batch slice for step {}, rank {}, micro-step {} (expected step >= 0, rank < {}, micro-step < {})",
                step, rank, micro_step, world_size_, accumulation_steps());
  return step * global_batch_ + rank * samples_per_rank() + int64_t{micro_step} * micro_batch_;
}

}  // namespace shardlm
