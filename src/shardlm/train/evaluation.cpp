#include "shardlm/train/evaluation.hpp"

#include <vector>

namespace shardlm {

EvalLoss evaluate_rows(ModelRunner& runner, const EvalRows& r, const FillEvalRow& fill) {
  const size_t micro_tokens = static_cast<size_t>(r.micro_batch) * static_cast<size_t>(r.seq_len);
  std::vector<int32_t> tokens(micro_tokens), targets(micro_tokens), positions, key_begin;
  if (r.positions) positions.resize(micro_tokens), key_begin.resize(micro_tokens);
  const RowBuffers out{tokens.data(), targets.data(), positions.empty() ? nullptr : positions.data(),
                       key_begin.empty() ? nullptr : key_begin.data()};
  const int64_t rows_per_pass = static_cast<int64_t>(r.micro_batch) * r.dp_size;
  EvalLoss loss;
  for (int64_t first = 0; first < r.rows; first += rows_per_pass) {
    for (int i = 0; i < r.micro_batch; ++i) {
      const int64_t row = first + static_cast<int64_t>(r.dp_rank) * r.micro_batch + i;
      if (row < r.rows)
        fill(row, out, i);
      else
        fill_empty_row(out, i, r.seq_len, r.positions);
    }
    const MicroBatch batch{tokens.data(), targets.data(), r.micro_batch, r.seq_len, out.positions,
                           out.key_begin};
    loss.loss_sum += runner.forward(batch, /*training=*/false, 0.0f);
    loss.target_count += runner.model().last_target_count();
  }
  return loss;
}

}  // namespace shardlm
