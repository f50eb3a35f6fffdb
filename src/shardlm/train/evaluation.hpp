// The forward-only loss over an evaluation split's rows. The trainer's validation
// (each data-parallel rank its share; the caller sums over ranks) and `shardlm eval`
// (one rank, every row) run this one loop.
#pragma once

#include <cstdint>
#include <functional>

#include "shardlm/train/batch_source.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

struct EvalRows {
  int64_t rows = 0;        // rows [0, rows) of the split
  int micro_batch = 1;     // rows per forward on each rank
  int seq_len = 0;
  bool positions = false;  // rows carry position ids and example starts
  int dp_rank = 0;         // this rank's data-parallel rank, of dp_size
  int dp_size = 1;
};

struct EvalLoss {
  double loss_sum = 0.0;  // over the targets that are not ignored
  int64_t target_count = 0;
};

// fill(row, out, at): row `row` of the split into row `at` of `out`.
using FillEvalRow = std::function<void(int64_t row, const RowBuffers& out, int at)>;

// Pass p gives rank r rows p * micro_batch * dp_size + r * micro_batch + [0, micro_batch);
// a rank's rows past the end are empty rows (no targets), so every rank runs the same
// forwards (zero3 gathers parameters in them) and the sums do not depend on how the
// rows fall on ranks. The runner's model must be sized for micro_batch x seq_len.
EvalLoss evaluate_rows(ModelRunner& runner, const EvalRows& rows, const FillEvalRow& fill);

}  // namespace shardlm
