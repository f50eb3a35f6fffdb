// When a run evaluates and writes checkpoints: after every --eval-every and
// --save-every steps and after the last step, and a checkpoint between steps once
// --save-every-minutes have passed on rank 0's clock (the ranks agree on it at the
// step boundary, train/run_control.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "shardlm/core/timer.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

class CheckpointSchedule {
 public:
  // Reads `options` when asked (its --steps may resolve later: --epochs); it must
  // outlive the schedule.
  explicit CheckpointSchedule(const TrainOptions& options) : o_(options) {}

  bool evaluates_after(int64_t done) const {
    return (o_.eval_every > 0 && done % o_.eval_every == 0) || done == o_.steps;
  }
  bool saves_after(int64_t done) const {
    return (o_.save_every > 0 && done % o_.save_every == 0) || done == o_.steps;
  }
  // Whether --save-every-minutes calls for a checkpoint before `step`: never before
  // this invocation's first step (nothing new to save yet).
  bool save_due(int64_t step, int64_t first_step) const {
    return step > first_step && o_.save_every_minutes > 0 &&
           since_save_.seconds() >= o_.save_every_minutes * 60.0;
  }
  void restart_clock() { since_save_.restart(); }
  // RUN/checkpoints/step_NNNNNNNN
  std::string checkpoint_dir(int64_t step) const;

 private:
  const TrainOptions& o_;
  Stopwatch since_save_;
};

}  // namespace shardlm
