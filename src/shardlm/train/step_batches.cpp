#include "shardlm/train/step_batches.hpp"

namespace shardlm {

StepBatches::StepBatches(const BatchPartition& batches, int seq_len, bool positions)
    : batches_(batches),
      micro_batch_(static_cast<int>(batches.micro_batch())),
      seq_len_(seq_len),
      accumulation_(batches.accumulation_steps()),
      micro_tokens_(static_cast<size_t>(micro_batch_) * static_cast<size_t>(seq_len)) {
  tokens_.assign(micro_tokens_ * static_cast<size_t>(accumulation_), 0);
  targets_.assign(tokens_.size(), 0);
  if (positions) {
    positions_.assign(tokens_.size(), 0);
    key_begin_.assign(tokens_.size(), 0);
  }
}

int64_t StepBatches::fill(BatchSource& data, int64_t step, int dp_rank) {
  for (int k = 0; k < accumulation_; ++k) {
    const RowBuffers rows{tokens_.data() + offset(k), targets_.data() + offset(k),
                          positions_.empty() ? nullptr : positions_.data() + offset(k),
                          key_begin_.empty() ? nullptr : key_begin_.data() + offset(k)};
    data.fill_train(batches_.first_sample(step, dp_rank, k), micro_batch_, rows);
  }
  int64_t targets = 0;
  for (int32_t t : targets_) targets += (t != kIgnoreIndex);
  return targets;
}

MicroBatch StepBatches::micro_batch(int k) const {
  return MicroBatch{tokens_.data() + offset(k), targets_.data() + offset(k), micro_batch_, seq_len_,
                    positions_.empty() ? nullptr : positions_.data() + offset(k),
                    key_begin_.empty() ? nullptr : key_begin_.data() + offset(k)};
}

}  // namespace shardlm
