// Registration of each subcommand's flags and callback on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>

#include "shardlm/train/train_options.hpp"

namespace shardlm::cli {

// The flags that shape a run (model, batch, strategy, precision), shared by `train`
// and `plan`; and the rest of `train`'s (schedule, checkpoints, threads, ...).
void add_run_shape_flags(CLI::App& cmd, TrainOptions& opts);
void add_run_flags(CLI::App& cmd, TrainOptions& opts);
// A bare --tensorboard (given without DIR) means RUN/tb.
void resolve_tensorboard_flag(const CLI::App& cmd, TrainOptions& opts);

// --threads of the single-process commands (eval, sample): Error unless >= 1; sets
// OpenMP's thread count when given.
void apply_threads_flag(const std::optional<int>& threads);

void register_prepare(CLI::App& app);
void register_train(CLI::App& app);
void register_sft(CLI::App& app);
void register_sample(CLI::App& app);
void register_inspect(CLI::App& app);
void register_launch(CLI::App& app);
void register_export(CLI::App& app);
void register_eval(CLI::App& app);
void register_plan(CLI::App& app);
void register_calibrate(CLI::App& app);
void register_bench(CLI::App& app);
void register_report(CLI::App& app);
void register_chat(CLI::App& app);

// `shardlm report`'s page for a run or bench directory, written to out_path (default
// DIR/report.html); returns the path written.
std::string write_report(const std::string& dir, const std::string& out_path);

}  // namespace shardlm::cli
