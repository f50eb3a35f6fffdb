// This rank's rows for every micro-batch of a step, allocated once (positions and
// example starts only for data with example boundaries) and filled by global sample
// index (BatchPartition), so every strategy and world size trains on the same rows.
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/data/sampler.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/train/batch_source.hpp"

namespace shardlm {

class StepBatches {
 public:
  // micro_batch rows of seq_len tokens, `batches.accumulation_steps()` micro-batches.
  StepBatches(const BatchPartition& batches, int seq_len, bool positions);

  // The rows data-parallel rank dp_rank trains on at `step`; returns how many of
  // their targets are not ignored.
  int64_t fill(BatchSource& data, int64_t step, int dp_rank);
  // Micro-batch k (0 .. accumulation_steps - 1) of the last fill.
  MicroBatch micro_batch(int k) const;

 private:
  size_t offset(int k) const { return micro_tokens_ * static_cast<size_t>(k); }
  const BatchPartition& batches_;
  const int micro_batch_, seq_len_, accumulation_;
  const size_t micro_tokens_;
  std::vector<int32_t> tokens_, targets_, positions_, key_begin_;
};

}  // namespace shardlm
