// `shardlm plan`: memory per rank by category, traffic per step and, with a hardware
// profile, step time for each candidate strategy, and the one to use.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/config_file.hpp"
#include "shardlm/cli/plan_advice.hpp"
#include "shardlm/cli/plan_flags.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/plan/recommend.hpp"

namespace shardlm::cli {
namespace {

std::string msf(double seconds) { return fmt::format("{:.1f}", seconds * 1e3); }

nlohmann::json time_json(const StepTimePrediction& t) {
  nlohmann::json comm = nlohmann::json::object();
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const CollectiveTotals& c = t.comm[static_cast<size_t>(k)];
    if (c.calls == 0) continue;
    comm[std::string(to_string(static_cast<CollectiveKind>(k)))] = {
        {"calls", c.calls}, {"bus_bytes", c.bus_bytes}, {"messages", c.messages},
        {"ms", c.seconds * 1e3}, {"exposed_ms", c.exposed_s * 1e3}};
  }
  return {{"compute_ms", t.compute_s * 1e3},
          {"compute_split_ms",
           {{"gemm", t.gemm_s * 1e3}, {"attention", t.attention_s * 1e3},
            {"elementwise", t.elementwise_s * 1e3}, {"loss", t.loss_s * 1e3},
            {"state", t.state_s * 1e3}, {"optimizer", t.optimizer_s * 1e3}}},
          {"comm_ms", t.comm_s * 1e3},
          {"exposed_comm_ms", t.exposed_s * 1e3},
          {"overlap_cost_ms", t.overlap_cost_s * 1e3},
          {"step_ms", t.step_s * 1e3},
          {"tokens_per_s", t.tokens_per_s},
          {"collectives", comm}};
}

nlohmann::json plan_json(const RunPlan& p, const std::optional<StepTimePrediction>& time) {
  nlohmann::json j = {{"params", p.params},
                      {"grads", p.grads},
                      {"optimizer", p.optimizer},
                      {"activations", p.activations},
                      {"comm", p.comm},
                      {"frozen", p.frozen},
                      {"total", p.total()},
                      {"wire_bytes_per_step", p.wire_bytes_per_step},
                      {"partition", p.partition},
                      {"tensor_parallel", p.tensor_parallel},
                      {"expert_parallel", p.expert_parallel},
                      {"accumulation", p.accumulation},
                      {"parameters", p.parameters},
                      {"flops_per_step", p.flops_per_step},
                      {"tokens_per_step", p.tokens_per_step}};
  if (p.tensor_parallel > 1) {
    const GroupTraffic t = last_step_traffic(p, CommGroup::tensor);
    j["tensor_group"] = {{"calls", t.calls}, {"bus_bytes", t.bus_bytes}};
  }
  j["device"] = to_string(p.device);
  if (!p.device.is_host())
    j["host"] = {{"params", p.host.params}, {"grads", p.host.grads},
                 {"optimizer", p.host.optimizer}, {"frozen", p.host.frozen},
                 {"comm", p.host.comm},
                 {"total", p.host.total()}};
  if (time) j["time"] = time_json(*time);
  return j;
}

// The candidate the flags asked for, marked in the tables.
bool asked(const Candidate& c, const RunPlanRequest& r) {
  const StrategyOptions& a = c.request.strategy;
  return a.kind == r.strategy.kind && a.tensor_parallel == r.strategy.tensor_parallel &&
         a.context_parallel == r.strategy.context_parallel &&
         a.expert_parallel == r.strategy.expert_parallel &&
         (a.context_parallel == 1 || c.request.model.context_parallel_kind == r.model.context_parallel_kind) &&
         (a.kind != StrategyKind::hybrid || a.shard_group_size == r.strategy.shard_group_size) &&
         (!shards_parameters(a.kind) || a.reshard_after_forward == r.strategy.reshard_after_forward) &&
         c.request.model.activation_checkpointing == r.model.activation_checkpointing;
}

std::string label(const Candidate& c, const RunPlanRequest& r, bool automatic) {
  return c.label + (!automatic && asked(c, r) ? " (asked)" : "");
}

void print_memory_table(const std::vector<Candidate>& candidates, const MemoryBudget& budget,
                        const RunPlanRequest& r, bool automatic) {
  // Sizes are in GiB from 1 GiB up (gib()), in MiB below.
  const bool bounded = std::isfinite(budget.per_rank);
  std::printf("| candidate | params | frozen | grads | optimizer | activations | comm | total per rank "
              "| on wire per step |%s\n",
              bounded ? " fits |" : "");
  std::printf("|---|---|---|---|---|---|---|---|---|%s\n", bounded ? "---|" : "");
  for (const Candidate& c : candidates) {
    const RunPlan& p = c.plan;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |%s\n", label(c, r, automatic).c_str(),
                gib(p.params).c_str(), gib(p.frozen).c_str(), gib(p.grads).c_str(),
                gib(p.optimizer).c_str(), gib(p.activations).c_str(), gib(p.comm).c_str(),
                gib(p.total()).c_str(), gib(p.wire_bytes_per_step).c_str(),
                bounded ? (budget.fits_device(p) ? " yes |" : " no |") : "");
  }
  if (r.model.device.is_host()) return;
  std::printf("\nMemory per rank above is on the device (%s)%s. Host memory per rank (the "
              "owned state HostOwnedState keeps there: %s):\n\n",
              to_string(r.model.device).c_str(),
              r.strategy.optimizer_on_host ? ", with the optimizer offloaded (--offload optimizer)" : "",
              r.strategy.optimizer_on_host
                  ? "fp32 master, the gradient's fp32 accumulation and a staging slice, AdamW m "
                    "and v, frozen weights; and the host communicator's scratch"
                  : "a mirror of the master, AdamW m and v and frozen weights, for checkpoints; "
                    "and the host communicator's scratch");
  const bool host_bounded = std::isfinite(budget.host_per_node);
  std::printf("| candidate | host params | host grads | host optimizer | host frozen "
              "| host comm | host total per rank | host per node (%d ranks) |%s\n",
              budget.ranks_per_node,
              host_bounded ? fmt::format(" fits {} per node |", gib(budget.host_per_node)).c_str() : "");
  std::printf("|---|---|---|---|---|---|---|---|%s\n", host_bounded ? "---|" : "");
  for (const Candidate& c : candidates) {
    const RunPlan::Host& h = c.plan.host;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s |%s\n", label(c, r, automatic).c_str(),
                gib(h.params).c_str(), gib(h.grads).c_str(), gib(h.optimizer).c_str(),
                gib(h.frozen).c_str(), gib(h.comm).c_str(), gib(h.total()).c_str(),
                gib(budget.host_per_node_of(c.plan)).c_str(),
                host_bounded ? (budget.fits_host(c.plan) ? " yes |" : " no |") : "");
  }
  if (!host_bounded)
    std::printf("\nHost memory per node not known (no profile with it, no --host-memory-per-node): "
                "the host side is not checked.\n");
}

void print_time_table(const std::vector<Candidate>& candidates, const RunPlanRequest& r,
                      bool automatic) {
  std::printf("| candidate | compute ms | of which GEMM / attention / elementwise+loss / state "
              "| comm ms | exposed comm ms | overlap cost ms | step ms | tokens/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Candidate& c : candidates) {
    const StepTimePrediction& t = *c.time;
    std::printf("| %s | %s | %s / %s / %s / %s | %s | %s | %s | %s | %.0f |\n",
                label(c, r, automatic).c_str(),
                msf(t.compute_s).c_str(), msf(t.gemm_s).c_str(), msf(t.attention_s).c_str(),
                msf(t.elementwise_s + t.loss_s).c_str(), msf(t.state_s).c_str(),
                msf(t.comm_s).c_str(), msf(t.exposed_s).c_str(), msf(t.overlap_cost_s).c_str(),
                msf(t.step_s).c_str(), t.tokens_per_s);
  }
}

void print_collectives(const Candidate& c) {
  std::printf("\nCollectives of %s per step (per rank):\n", c.label.c_str());
  std::printf("| collective | calls | MiB (bus) | messages | ms | exposed ms |\n|---|---|---|---|---|---|\n");
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const CollectiveTotals& t = c.time->comm[static_cast<size_t>(k)];
    if (t.calls == 0) continue;
    std::printf("| %s | %lld | %s | %.0f | %s | %s |\n",
                std::string(to_string(static_cast<CollectiveKind>(k))).c_str(),
                static_cast<long long>(t.calls), fmt::format("{:.1f}", t.bus_bytes / (1 << 20)).c_str(), t.messages,
                msf(t.seconds).c_str(), msf(t.exposed_s).c_str());
  }
}

struct PlanFlags {
  TrainOptions run;
  int ranks = 1;
  std::optional<double> memory_per_rank_gib;
  std::optional<double> host_memory_per_node_gib;
  ProfileOptions profile;
  bool json = false;
  bool device_given = false;  // --device on the command line (else: the profile's kind)
};

void run_plan(const PlanFlags& f) {
  SHARDLM_CHECK(f.ranks >= 1, "-n must be at least 1, got {}", f.ranks);
  SHARDLM_CHECK(!f.memory_per_rank_gib || *f.memory_per_rank_gib > 0,
                "--memory-per-rank must be a positive number of GiB, got {}",
                f.memory_per_rank_gib.value_or(0));
  SHARDLM_CHECK(!f.host_memory_per_node_gib || *f.host_memory_per_node_gib > 0,
                "--host-memory-per-node must be a positive number of GiB, got {}",
                f.host_memory_per_node_gib.value_or(0));
  TrainOptions run = f.run;
  // The built-in profiles are GPU nodes: their runs compute on cuda unless told.
  const std::vector<std::string> gpu_profiles = builtin_profile_names();
  if (!f.device_given &&
      std::find(gpu_profiles.begin(), gpu_profiles.end(), f.profile.profile) != gpu_profiles.end())
    run.device = "cuda";
  const PlanInputs in = resolve_plan_inputs(run, f.ranks, f.profile);
  const HardwareProfile* profile = in.profile ? &*in.profile : nullptr;
  MemoryBudget budget;
  if (f.memory_per_rank_gib) budget.per_rank = *f.memory_per_rank_gib * double(1ll << 30);
  else if (profile) budget.per_rank = profile->memory_per_rank_bytes;
  if (f.host_memory_per_node_gib)
    budget.host_per_node = *f.host_memory_per_node_gib * double(1ll << 30);
  else if (profile && profile->host_memory_per_node_bytes > 0)
    budget.host_per_node = profile->host_memory_per_node_bytes;
  budget.ranks_per_node = f.ranks / in.cluster.nodes;
  const bool bounded = std::isfinite(budget.per_rank) || std::isfinite(budget.host_per_node);
  const bool automatic = f.run.strategy == "auto";

  if (f.json && !automatic) {
    const RunPlan plan = plan_run(in.request);
    std::optional<StepTimePrediction> time;
    if (profile) time = predict_step_time(plan, *profile, in.cluster);
    std::printf("%s\n", plan_json(plan, time).dump(1).c_str());
    return;
  }
  // --strategy auto searches tensor (and, when nothing fits, context) parallelism too.
  AutoSearch search;
  if (automatic) {
    search = auto_search(in.request, profile, in.cluster, budget);
  } else {
    search.candidates = plan_candidates(in.request, profile, in.cluster, /*vary_checkpointing=*/true);
    if (bounded || profile)
      search.recommendation = recommend(search.candidates, budget, in.request, profile, in.cluster);
  }
  const std::vector<Candidate>& candidates = search.candidates;
  const Recommendation& rec = search.recommendation;
  // Beside the recommendation: the decision tree's other moves when nothing fits, and a
  // second node that slows the job down (cli/plan_advice.hpp).
  const PlannedJob job{run, f.ranks, f.profile, budget};
  std::vector<PlannedAlternative> alternatives;
  if (!rec.explanation.empty() && !rec.chosen) alternatives = plan_alternatives(job);
  const std::optional<std::string> slowdown =
      rec.chosen ? second_node_slowdown(job, candidates[*rec.chosen]) : std::nullopt;
  if (f.json) {
    nlohmann::json j = {{"explanation", rec.explanation}};
    if (rec.chosen) {
      const Candidate& c = candidates[*rec.chosen];
      j["candidate"] = c.label;
      j["flags"] = candidate_flags(c);
      j["plan"] = plan_json(c.plan, c.time);
    }
    if (!alternatives.empty()) {
      j["alternatives"] = nlohmann::json::array();
      for (const PlannedAlternative& a : alternatives)
        j["alternatives"].push_back({{"move", a.move}, {"flags", a.flags}, {"fits", a.fits},
                                     {"candidate_flags", a.candidate_flags}, {"explanation", a.explanation}});
    }
    if (slowdown) j["second_node"] = *slowdown;
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  const RunPlan& any = candidates.front().plan;
  std::printf("%s: %.1fM parameters (Psi, padded), %d rank(s) on %d node(s), device %s, micro-batch "
              "%d x %d tokens, %d accumulation step(s), %s%s\n",
              model_source(run).c_str(), static_cast<double>(any.parameters) / 1e6, f.ranks,
              in.cluster.nodes, run.device.c_str(), run.micro_batch, run.seq_len, any.accumulation,
              run.precision.c_str(),
              run.reduce_dtype == "bf16" ? ", gradients reduced in bf16" : "");
  std::printf("model FLOPs per rank and step: %.1f GFLOP\n", any.flops_per_step / 1e9);
  if (any.tensor_parallel > 1) {
    // The layers' partial sums, the model's (the first candidate's: checkpointing adds the
    // recomputed forward's).
    const GroupTraffic t = last_step_traffic(any, CommGroup::tensor);
    std::printf("tensor group of %d ranks (innermost): %lld %s per rank and step (%.1f per "
                "layer and micro-batch), %s on the wire\n",
                any.tensor_parallel, static_cast<long long>(t.calls),
                run.sequence_parallel ? "all-gathers and reduce-scatters" : "all-reduces",
                static_cast<double>(t.calls) / (in.config.n_layer * any.accumulation),
                gib(t.bus_bytes).c_str());
  }
  std::printf("\n");
  print_memory_table(candidates, budget, in.request, automatic);
  std::printf("\nBytes are what the run allocates per rank (to the byte; plus a few KiB for "
              "the data order). Traffic is bus bytes per rank and step.\n");
  if (profile) {
    std::printf("\nStep time on profile '%s' (%s), %d rank(s) per node; within a node: %s%s%s\n\n",
                profile->name.c_str(), profile->description.c_str(), f.ranks / in.cluster.nodes,
                profile->intra_node.name.c_str(),
                in.cluster.nodes > 1 ? ", between nodes: " : "",
                in.cluster.nodes > 1 ? (in.cluster.link.empty() ? profile->inter_node.name
                                                                : in.cluster.link).c_str()
                                     : "");
    print_time_table(candidates, in.request, automatic);
    std::printf("\nexposed comm: the compute thread waiting for collectives; overlap cost: "
                "computation slowed while collectives ran beside it (docs/planning.md).\n");
  } else {
    std::printf("\nNo step time: no hardware profile (run `shardlm calibrate`, which writes %s, "
                "or pass --profile %s or a profile file).\n",
                default_profile_path().c_str(), fmt::format("{}", fmt::join(builtin_profile_names(), "|")).c_str());
  }
  if (!rec.explanation.empty()) {
    if (rec.chosen && profile) print_collectives(candidates[*rec.chosen]);
    std::printf("\nrecommended%s: %s%s%s\n",
                std::isfinite(budget.per_rank) ? fmt::format(" for {} per rank", gib(budget.per_rank)).c_str() : "",
                rec.chosen ? candidate_flags(candidates[*rec.chosen]).c_str() : "",
                rec.chosen ? "\n  why: " : "", rec.explanation.c_str());
  }
  if (!alternatives.empty()) {
    std::printf("\nwhat the seed documents' decision tree would try, each planned with its flags:\n");
    for (const PlannedAlternative& a : alternatives)
      std::printf("  %s, %s%s: %s\n", a.move.c_str(), a.flags.c_str(),
                  a.fits ? (" " + a.candidate_flags).c_str() : "", a.explanation.c_str());
  }
  if (slowdown) std::printf("\nwarning: %s\n", slowdown->c_str());
}

}  // namespace

void register_plan(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  auto* cmd = app.add_subcommand(
      "plan",
      "Predict memory per rank, traffic and step time of a run for each strategy, and "
      "recommend one");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("-n,--ranks", flags->ranks, "Ranks (processes) of the run")->capture_default_str();
  cmd->add_option("--data", flags->run.data_dir,
                  "Prepared data directory, for its vocabulary (default: the preset's)");
  cmd->add_option("--memory-per-rank", flags->memory_per_rank_gib,
                  "GiB available per rank (default: the profile's memory per rank)");
  cmd->add_option("--host-memory-per-node", flags->host_memory_per_node_gib,
                  "GiB of host memory per node, which a device run's host side of every rank "
                  "on the node shares (default: the profile's)");
  add_profile_flags(*cmd, flags->profile);
  cmd->add_flag("--json", flags->json,
                "Print the plan of --strategy as JSON (bytes; with a profile, times), or with "
                "--strategy auto the recommendation");
  add_run_shape_flags(*cmd, flags->run);
  cmd->get_option("--device")
      ->description("Where each rank computes: cpu, cuda or emulated (default: cuda with a built-in "
                    "GPU profile (--profile " + fmt::format("{}", fmt::join(builtin_profile_names(), ", ")) +
                    "), else cpu)")
      ->default_str("");
  add_config_flag(*cmd);
  cmd->callback([flags, cmd]() {
    flags->device_given = cmd->count("--device") > 0;
    run_plan(*flags);
  });
}

}  // namespace shardlm::cli
