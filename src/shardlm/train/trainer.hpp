// The training loop (docs/architecture.md "The step"): data -> micro-batches -> forward and
// backward through the strategy's hooks -> global-norm clipping -> AdamW on the
// owned slices -> metrics, progress, evaluation, checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

struct TrainSummary {
  int64_t first_step = 0;  // > 0 when resumed
  int64_t steps = 0;       // last completed step
  int64_t tokens = 0;      // tokens trained on in this invocation
  double first_loss = std::numeric_limits<double>::quiet_NaN();  // no step run: NaN
  double final_train_loss = 0.0;
  double final_val_loss = 0.0;
  // The median step's tokens/s (steady state), and tokens over the whole loop's
  // time, evaluations and checkpoint saves included.
  double tokens_per_s = 0.0;
  double tokens_per_s_incl_eval_save = 0.0;
  double wall_s = 0.0;
  std::string sample;  // generated text, when asked for
  nlohmann::json memory;  // MemoryTracker::to_json() at the end
  int64_t num_parameters = 0;
  int64_t num_trainable_parameters = 0;  // a LoRA run: the adapters'
  std::string last_checkpoint;
  bool is_root = true;  // rank 0 prints; other ranks stay quiet
  // Stopped by a signal (stop_signals.hpp) at a checkpoint: the line that says so,
  // "stopped by SIGTERM at step 12: checkpoint step_00000012 written; continue with
  // --resume". Empty when the run went to its end.
  std::string stopped;
};

// What a subcommand adds to a run, once the world communicator exists.
struct RunSetup {
  // Rank 0, before any rank reads the data, after the run directory's lock is taken
  // (`sft` renders its chat dataset there); an Error in it ends every rank's job.
  std::function<void()> prepare_data;
  // Collective: the options the run trains with. --strategy auto needs it (plan's
  // recommendation, plan/auto_strategy.hpp, which lives above train); empty: the
  // options as given.
  std::function<TrainOptions(const TrainOptions&, Communicator&)> resolve_options;
};

// Runs `shardlm train`. Throws Error for bad input (before touching RUN_DIR where
// possible) and for a NaN/inf loss (the last checkpoint is left as it was).
// SIGTERM, SIGINT or SIGUSR1 stops the run at the next step boundary with a
// checkpoint (summary.stopped; stop_signals.hpp).
TrainSummary run_training(const TrainOptions& options, const RunSetup& setup = {});

// "trainable params: 1,081,344 || all params: 125,520,384 || trainable%: 0.8615", as
// PEFT's print_trainable_parameters() says it.
std::string trainable_params_line(int64_t trainable, int64_t all);

// Prints the end-of-run summary table.
void print_summary(const TrainSummary& summary);

// When the run was stopped by a signal: rank 0 prints summary.stopped on stdout after
// the summary and the process exits with kExitStoppedAtCheckpoint. Returns otherwise.
void exit_if_stopped(const TrainSummary& summary);

}  // namespace shardlm
