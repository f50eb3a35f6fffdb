// `shardlm plan`: memory per rank by category and traffic per step, predicted before
// a run for each strategy, and the strategy to use for a memory budget.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "shardlm/core/dtype.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/plan/run_plan.hpp"

namespace shardlm::cli {
namespace {

struct PlanFlags {
  TrainOptions run;
  int ranks = 1;
  std::optional<double> memory_per_rank_gib;
  bool json = false;
};

RunPlanRequest request_for(const PlanFlags& f, const ModelConfig& config, StrategyKind kind) {
  RunPlanRequest r;
  r.config = config;
  r.world_size = f.ranks;
  r.strategy = {kind,
                f.run.bucket_mb,
                f.run.prefetch,
                f.run.reshard_after_forward,
                f.run.shard_group_size,
                parse_dtype(f.run.precision, "--precision"),
                parse_dtype(f.run.reduce_dtype, "--reduce-dtype")};
  r.model = {parse_dtype(f.run.precision, "--precision"), f.run.activation_checkpointing};
  r.micro_batch = f.run.micro_batch;
  r.seq_len = f.run.seq_len;
  r.global_batch = f.run.global_batch;
  r.min_unit_params = f.run.min_unit_params;
  return r;
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / (1 << 20)); }

nlohmann::json to_json(const RunPlan& p) {
  return {{"params", p.params},       {"grads", p.grads},
          {"optimizer", p.optimizer}, {"activations", p.activations},
          {"comm", p.comm},           {"total", p.total()},       {"wire_bytes_per_step", p.wire_bytes_per_step},
          {"partition", p.partition}, {"accumulation", p.accumulation},
          {"parameters", p.parameters}, {"flops_per_step", p.flops_per_step}};
}

void run_plan(const PlanFlags& f) {
  SHARDLM_CHECK(f.ranks >= 1, "-n must be at least 1, got {}", f.ranks);
  SHARDLM_CHECK(!f.memory_per_rank_gib || *f.memory_per_rank_gib > 0,
                "--memory-per-rank must be a positive number of GiB, got {}",
                f.memory_per_rank_gib.value_or(0));
  SHARDLM_CHECK(f.run.micro_batch > 0 && f.run.seq_len > 0,
                "--micro-batch and --seq-len must be positive, got {} and {}", f.run.micro_batch,
                f.run.seq_len);
  SHARDLM_CHECK(f.run.reduce_dtype == "fp32" || f.run.reduce_dtype == "bf16",
                "--reduce-dtype must be fp32 or bf16, got '{}'", f.run.reduce_dtype);
  const int data_vocab = f.run.data_dir.empty()
                             ? model_preset(f.run.model).vocab_size
                             : static_cast<int>(read_dataset_meta(f.run.data_dir).vocab_size);
  const ModelConfig config = resolve_model_config(f.run, data_vocab);
  SHARDLM_CHECK(f.run.seq_len <= config.max_seq_len,
                "--seq-len {} is longer than the model's context ({} positions)", f.run.seq_len,
                config.max_seq_len);
  const StrategyKind chosen = parse_strategy_kind(f.run.strategy);
  if (f.json) {
    std::printf("%s\n", to_json(plan_run(request_for(f, config, chosen))).dump(1).c_str());
    return;
  }
  std::vector<StrategyKind> kinds = {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                                     StrategyKind::zero3};
  if (chosen == StrategyKind::hybrid) kinds.push_back(StrategyKind::hybrid);
  std::vector<RunPlan> plans;
  for (StrategyKind k : kinds) plans.push_back(plan_run(request_for(f, config, k)));
  const RunPlan& any = plans.front();
  std::printf("%s: %.1fM parameters (Psi, padded), %d rank(s), micro-batch %d x %d tokens, "
              "%d accumulation step(s), %s%s%s\n",
              f.run.model.c_str(), static_cast<double>(any.parameters) / 1e6, f.ranks,
              f.run.micro_batch, f.run.seq_len, any.accumulation, f.run.precision.c_str(),
              f.run.activation_checkpointing ? ", activation checkpointing" : "",
              f.run.reduce_dtype == "bf16" ? ", gradients reduced in bf16" : "");
  std::printf("model FLOPs per rank and step: %.1f GFLOP\n\n", any.flops_per_step / 1e9);
  std::printf("| strategy | params MiB | grads MiB | optimizer MiB | activations MiB | comm MiB "
              "| total MiB per rank | MiB on wire per step |%s\n",
              f.memory_per_rank_gib ? " fits |" : "");
  std::printf("|---|---|---|---|---|---|---|---|%s\n", f.memory_per_rank_gib ? "---|" : "");
  const double budget = f.memory_per_rank_gib.value_or(0) * (1ll << 30);
  std::optional<size_t> recommended;
  for (size_t i = 0; i < plans.size(); ++i) {
    const RunPlan& p = plans[i];
    const bool fits = static_cast<double>(p.total()) <= budget;
    if (fits && !recommended) recommended = i;  // kinds go from least to most traffic
    std::printf("| %s%s | %s | %s | %s | %s | %s | %s | %.1f |%s\n",
                to_string(kinds[i]).c_str(), kinds[i] == chosen ? " (chosen)" : "",
                mib(p.params).c_str(), mib(p.grads).c_str(), mib(p.optimizer).c_str(),
                mib(p.activations).c_str(), mib(p.comm).c_str(),
                mib(p.total()).c_str(), p.wire_bytes_per_step / (1 << 20),
                f.memory_per_rank_gib ? (fits ? " yes |" : " no |") : "");
  }
  std::printf("\nBytes are what the run allocates per rank (to the byte; plus a few KiB for "
              "the data order). Traffic is bus bytes per rank and step.\n");
  if (!f.memory_per_rank_gib) return;
  if (recommended) {
    std::printf("recommended for %.2f GiB per rank: --strategy %s (the least traffic of those "
                "that fit)\n",
                *f.memory_per_rank_gib, to_string(kinds[*recommended]).c_str());
  } else {
    std::printf("nothing fits in %.2f GiB per rank: try more ranks (-n), --precision bf16, "
                "--activation-checkpointing or a smaller --micro-batch\n",
                *f.memory_per_rank_gib);
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  auto* cmd = app.add_subcommand(
      "plan", "Predict memory per rank and traffic per step of a run, for each strategy");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("-n,--ranks", flags->ranks, "Ranks (processes) of the run")->capture_default_str();
  cmd->add_option("--data", flags->run.data_dir,
                  "Prepared data directory, for its vocabulary (default: the preset's)");
  cmd->add_option("--memory-per-rank", flags->memory_per_rank_gib,
                  "GiB available per rank: recommend the strategy with the least traffic that "
                  "fits");
  cmd->add_flag("--json", flags->json, "Print the plan of --strategy as JSON (bytes)");
  add_run_shape_flags(*cmd, flags->run);
  cmd->callback([flags]() { run_plan(*flags); });
}

}  // namespace shardlm::cli
