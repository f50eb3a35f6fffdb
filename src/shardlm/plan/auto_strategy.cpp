#include "shardlm/plan/auto_strategy.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/parallel/strategy_options.hpp"
#include "shardlm/plan/plan_inputs.hpp"
#include "shardlm/plan/recommend.hpp"
#include "shardlm/train/thread_budget.hpp"

namespace shardlm {

namespace {

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

struct JobShape {
  int hosts = 1;
  double budget_bytes = 0;  // per rank: the least over the hosts of MemAvailable / its ranks
};

// Collective: which ranks share a host, and each host's memory per rank.
JobShape job_shape(Communicator& comm) {
  const std::vector<uint64_t> hosts = comm.all_gather_u64(host_hash(), "auto strategy: hosts");
  const uint64_t mine = hosts[static_cast<size_t>(comm.rank())];
  const auto ranks_here = std::count(hosts.begin(), hosts.end(), mine);
  const std::vector<uint64_t> budgets = comm.all_gather_u64(
      available_memory_bytes() / static_cast<uint64_t>(ranks_here), "auto strategy: memory");
  JobShape shape;
  shape.hosts = static_cast<int>(std::set<uint64_t>(hosts.begin(), hosts.end()).size());
  shape.budget_bytes = static_cast<double>(*std::min_element(budgets.begin(), budgets.end()));
  return shape;
}

// Rank 0's decision as the JSON it broadcasts: the chosen options and the line, or
// the error every rank reports.
nlohmann::json decide(const TrainOptions& o, int world_size, const JobShape& shape) {
  ProfileOptions profile_options;
  // Ranks spread evenly over hosts are nodes to the time model; otherwise plan as one.
  profile_options.nodes = world_size % shape.hosts == 0 ? shape.hosts : 1;
  PlanInputs in = resolve_plan_inputs(o, world_size, profile_options);
  std::string note;
  if (in.profile) {
    bool has_precision = false;
    for (const auto& c : in.profile->compute)
      has_precision = has_precision || c.by_precision.count(o.precision) > 0;
    if (!has_precision) {
      note = fmt::format(" (profile {} has no {} figures: decided without step times)",
                         default_profile_path(), o.precision);
      in.profile.reset();
    }
  }
  const HardwareProfile* profile = in.profile ? &*in.profile : nullptr;
  MemoryBudget budget(o.memory_per_rank_gib ? *o.memory_per_rank_gib * double(1ll << 30)
                                            : shape.budget_bytes);
  // A device run's host side (HostOwnedState) must fit this host's memory too: each
  // rank's share of it, measured (so per rank, one rank per share).
  budget.host_per_node = shape.budget_bytes;
  budget.ranks_per_node = 1;
  const AutoSearch search = auto_search(in.request, profile, in.cluster, budget);
  const std::vector<Candidate>& candidates = search.candidates;
  const Recommendation& rec = search.recommendation;
  if (!rec.chosen) return {{"error", "--strategy auto: " + rec.explanation}};
  const Candidate& c = candidates[*rec.chosen];
  const StrategyOptions& s = c.request.strategy;
  return {{"strategy", to_string(s.kind)},
          {"reshard_after_forward", s.reshard_after_forward},
          {"shard_group_size", s.kind == StrategyKind::hybrid ? s.shard_group_size : 0},
          {"activation_checkpointing", c.request.model.activation_checkpointing},
          {"tensor_parallel", c.request.strategy.tensor_parallel},
          {"global_batch", c.request.global_batch},
          {"context_parallel", s.context_parallel},
          {"context_parallel_kind", context_parallel_kind_name(c.request.model.context_parallel_kind)},
          {"ulysses_degree", c.request.model.ulysses_degree},
          {"expert_parallel", s.expert_parallel},
          {"sequence_parallel", c.request.model.sequence_parallel && s.tensor_parallel > 1},
          {"line", "strategy auto -> " + rec.explanation + note}};
}

}  // namespace

TrainOptions resolve_auto_strategy(const TrainOptions& o, Communicator& comm) {
  if (o.strategy != "auto") return o;
  const JobShape shape = job_shape(comm);
  std::string text;
  if (comm.rank() == 0) {
    nlohmann::json decision;
    try {
      decision = decide(o, comm.size(), shape);
    } catch (const Error& e) {
      decision = {{"error", e.what()}};  // every rank reports it, not only rank 0
    }
    text = decision.dump();
  }
  comm.broadcast_string(text, 0, "auto strategy: decision");
  const nlohmann::json decision = nlohmann::json::parse(text);
  if (decision.contains("error")) throw Error(decision.at("error").get<std::string>());
  TrainOptions resolved = o;
  resolved.strategy = decision.at("strategy").get<std::string>();
  resolved.reshard_after_forward = decision.at("reshard_after_forward").get<bool>();
  resolved.shard_group_size = decision.at("shard_group_size").get<int>();
  resolved.activation_checkpointing = decision.at("activation_checkpointing").get<bool>();
  resolved.tensor_parallel = decision.at("tensor_parallel").get<int>();
  // Another tensor, context or expert size than asked keeps the run's global batch
  // (plan's candidates all run the asked layout's; with --grad-accum, that layout's
  // micro-batches per rank: plan_request), which the run then names instead.
  if (const int global = decision.at("global_batch").get<int>(); global > 0) {
    resolved.global_batch = global;
    resolved.grad_accum = 0;
  }
  resolved.context_parallel = decision.at("context_parallel").get<int>();
  resolved.context_parallel_kind = decision.at("context_parallel_kind").get<std::string>();
  resolved.ulysses_degree = decision.at("ulysses_degree").get<int>();
  resolved.expert_parallel = decision.at("expert_parallel").get<int>();
  resolved.sequence_parallel = decision.at("sequence_parallel").get<bool>();
  resolved.strategy_reason = decision.at("line").get<std::string>();
  resolved.memory_per_rank_gib.reset();  // spent: the run validates as the strategy it runs
  if (comm.rank() == 0) {
    std::printf("%s\n", resolved.strategy_reason.c_str());
    std::fflush(stdout);
  }
  return resolved;
}

}  // namespace shardlm
