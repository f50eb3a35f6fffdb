// The training loop (docs/architecture.md "The step"): data -> micro-batches -> forward and
// backward through the strategy's hooks -> global-norm clipping -> AdamW on the
// owned slices -> metrics, progress, evaluation, checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/train/train_options.hpp"

namespace shardlm {

struct TrainSummary {
  int64_t first_step = 0;  // > 0 when resumed
  int64_t steps = 0;       // last completed step
  int64_t tokens = 0;      // tokens trained on in this invocation
  double first_loss = std::numeric_limits<double>::quiet_NaN();  // no step run: NaN
  double final_train_loss = 0.0;
  double final_val_loss = 0.0;
  double tokens_per_s = 0.0;
  double wall_s = 0.0;
  std::string sample;  // generated text, when asked for
  nlohmann::json memory;  // MemoryTracker::to_json() at the end
  int64_t num_parameters = 0;
  std::string last_checkpoint;
  bool is_root = true;  // rank 0 prints; other ranks stay quiet
};

// Runs `shardlm train`. Throws Error for bad input (before touching RUN_DIR where
// possible) and for a NaN/inf loss (the last checkpoint is left as it was).
// prepare_data, when given, runs on rank 0 before any rank reads the data (`sft`
// renders its chat dataset there); an Error in it ends every rank's job.
TrainSummary run_training(const TrainOptions& options,
                          const std::function<void()>& prepare_data = {});

// Prints the end-of-run summary table.
void print_summary(const TrainSummary& summary);

}  // namespace shardlm
