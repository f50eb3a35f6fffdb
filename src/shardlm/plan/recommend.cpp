#include "shardlm/plan/recommend.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <fmt/format.h>
#include <limits>
#include <optional>

#include "shardlm/core/error.hpp"
#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/model/context_parallel/context_split.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

std::string gib(double bytes) {
  // Small models and budgets would all read "0.0 GiB".
  if (std::abs(bytes) < double(1ll << 30)) return fmt::format("{:.1f} MiB", bytes / double(1 << 20));
  return fmt::format("{:.1f} GiB", bytes / double(1ll << 30));
}

std::string format_step_time(double seconds) {
  if (seconds >= 10) return fmt::format("{:.1f} s", seconds);
  if (seconds < 0.1) return fmt::format("{:.1f} ms", seconds * 1e3);
  return fmt::format("{:.0f} ms", seconds * 1e3);
}

namespace {

struct Choice {
  std::string label;
  StrategyKind kind;
  bool reshard;
  int group;
};

std::vector<Choice> strategy_choices(int world_size) {
  std::vector<Choice> choices = {{"ddp", StrategyKind::ddp, true, 0},
                                 {"zero1", StrategyKind::zero1, true, 0},
                                 {"zero2", StrategyKind::zero2, true, 0},
                                 {"zero3", StrategyKind::zero3, true, 0}};
  if (world_size > 1) choices.push_back({"zero3 no-reshard", StrategyKind::zero3, false, 0});
  for (int g = 2; g < world_size; ++g)
    if (world_size % g == 0)
      choices.push_back({fmt::format("hybrid {}", g), StrategyKind::hybrid, true, g});
  return choices;
}

bool fits(const Candidate& c, const MemoryBudget& budget) { return budget.fits(c.plan); }

bool accepted(const std::function<void()>& check) {
  try {
    check();
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Whether the run's mesh lays out (strategy_mesh's checks, which the trainer runs).
bool lays_out(const RunPlanRequest& r) {
  return accepted([&] { strategy_mesh(r.strategy, r.world_size); });
}

// The flags and label suffix of a context-parallel kind other than Ulysses.
std::string context_flags(const ContextLayout& l) {
  if (l.kind == ContextParallelKind::ulysses) return "";
  std::string flags = fmt::format(" --context-parallel-kind {}", context_parallel_kind_name(l.kind));
  if (l.kind == ContextParallelKind::hybrid) flags += fmt::format(" --ulysses-degree {}", l.ulysses_degree);
  return flags;
}
std::string context_label(const ContextLayout& l) {
  if (l.kind == ContextParallelKind::hybrid) return fmt::format(" hybrid u{}", l.ulysses_degree);
  return l.kind == ContextParallelKind::ring ? " ring" : "";
}

// The tokens of a rank's micro-batch before any tensor split (sequence parallelism
// divides them over the tensor ranks).
int64_t rank_tokens(const RunPlanRequest& r) {
  return static_cast<int64_t>(r.micro_batch) * r.seq_len / r.strategy.context_parallel;
}

// ", host 1200.0 GiB of 2048.0 GiB per node": a device run's host side, where it is
// bounded.
std::string host_use(const RunPlan& p, const MemoryBudget& budget) {
  if (p.host.total() == 0 || !std::isfinite(budget.host_per_node)) return "";
  return fmt::format(", host {} of {} per node", gib(budget.host_per_node_of(p)),
                     gib(budget.host_per_node));
}

// Step times closer than this (relative) are predicted equally fast: the model does
// not resolve smaller differences (its overlap and per-message figures are estimates,
// it counts no kernel launches, and measured steps vary by more). Small LoRA runs'
// ddp, zero1 and zero2 differ by less: their adapters' state is a few MiB, so the
// three differ only in when a few small collectives run (docs/planning.md).
constexpr double kEquallyFast = 0.01;
bool equally_fast(double a, double b) { return std::abs(a - b) <= kEquallyFast * std::max(a, b); }

// Step 3 among `eligible` (non-empty): the index into candidates. With times the
// fastest predicted wins: no candidate that fits is predicted faster than the one
// chosen by more than kEquallyFast. Among equally fast ones (and without times,
// among all) the fewest bytes on the wire win, then the simpler strategy (candidates
// come in order: ddp, zero1, zero2, zero3, ..., checkpointing last).
size_t pick(const std::vector<Candidate>& c, const std::vector<size_t>& eligible) {
  const bool timed = c[eligible.front()].time.has_value();
  double fastest = std::numeric_limits<double>::infinity();
  if (timed)
    for (size_t i : eligible) fastest = std::min(fastest, c[i].time->step_s);
  size_t chosen = eligible.front();
  bool found = false;
  for (size_t i : eligible) {
    if (timed && !equally_fast(c[i].time->step_s, fastest)) continue;
    const auto key = [&](size_t j) { return std::make_pair(c[j].plan.wire_bytes_per_step, j); };
    if (!found || key(i) < key(chosen)) chosen = i;
    found = true;
  }
  return chosen;
}

std::string why_chosen(const std::vector<Candidate>& c, const std::vector<size_t>& eligible,
                       size_t chosen, const MemoryBudget& memory) {
  const Candidate& x = c[chosen];
  const double budget = memory.per_rank;
  const bool bounded = std::isfinite(budget);
  // What more memory would buy: of the candidates that did not fit and are more than
  // 2% faster, the one needing the least.
  const auto more_memory = [&]() -> std::string {
    if (!x.time) return "";
    size_t faster = chosen;
    for (size_t i = 0; i < c.size(); ++i)
      if (!fits(c[i], memory) && c[i].time->step_s * 1.02 < x.time->step_s &&
          (faster == chosen || c[i].plan.total() < c[faster].plan.total()))
        faster = i;
    if (faster == chosen) return "";
    return fmt::format("; {} would take {} but needs {}", c[faster].label,
                       format_step_time(c[faster].time->step_s), gib(c[faster].plan.total()));
  };
  if (eligible.size() == 1 && (bounded || std::isfinite(memory.host_per_node))) {
    std::string s = fmt::format("{}: the only candidate that fits ({} of {} per rank{})", x.label,
                                gib(x.plan.total()), gib(budget), host_use(x.plan, memory));
    if (x.time) s += fmt::format("; predicted {} per step", format_step_time(x.time->step_s));
    return s + more_memory();
  }
  std::string s = x.label + ": ";
  if (bounded)
    s += fmt::format("fits with {} to spare{}", gib(budget - x.plan.total()), host_use(x.plan, memory));
  bool fewest = true;
  for (size_t i : eligible) fewest = fewest && c[i].plan.wire_bytes_per_step >= x.plan.wire_bytes_per_step;
  if (!x.time) {
    s += fmt::format("{}moves the fewest bytes of those that fit ({:.1f} MiB per step)",
                     bounded ? " and " : "", x.plan.wire_bytes_per_step / (1 << 20));
    return s;
  }
  // The runner-up among the other strategies (not the chosen one with checkpointing).
  const auto same_strategy = [&](size_t i) {
    const StrategyOptions& a = c[i].request.strategy;
    const StrategyOptions& b = x.request.strategy;
    return a.kind == b.kind && a.shard_group_size == b.shard_group_size &&
           a.reshard_after_forward == b.reshard_after_forward;
  };
  size_t runner_up = chosen;
  for (size_t i : eligible)
    if (!same_strategy(i) &&
        (runner_up == chosen || c[i].time->step_s < c[runner_up].time->step_s))
      runner_up = i;
  s += fmt::format("{}predicted {} per step ({:.0f} tokens/s)", bounded ? ", " : "",
                   format_step_time(x.time->step_s), x.time->tokens_per_s);
  if (runner_up != chosen) {
    const double other = c[runner_up].time->step_s;
    if (other < x.time->step_s)  // a tie, never a faster runner-up (pick)
      s += fmt::format(", as fast as {} ({:.2f} ms against {:.2f}: within {:.1f}%, the model's "
                       "resolution)",
                       c[runner_up].label, other * 1e3, x.time->step_s * 1e3, kEquallyFast * 100);
    else
      s += fmt::format(", next {} at {}", c[runner_up].label, format_step_time(other));
  }
  if (fewest) s += ", and moves the fewest bytes";
  return s + more_memory();
}

// Step 4: the first change, in order, that lets some candidate fit: activation
// checkpointing, bf16, a smaller micro-batch (same global batch), tensor parallelism
// inside a node (T ascending), expert parallelism (E ascending), context parallelism
// (P ascending, each with its kind), more ranks; then all of them together. Where the
// candidates already varied checkpointing, so do those of each change (the advice then
// names the "+ ckpt" candidate that fits); where they varied T, E or P already
// (--strategy auto), those changes are not tried again.
std::string smallest_change(const RunPlanRequest& base, bool checkpointing_tried, bool tensor_tried,
                            bool expert_tried, bool context_tried, const HardwareProfile* profile,
                            const ClusterShape& cluster, const MemoryBudget& budget) {
  struct Change {
    std::string flags;
    RunPlanRequest request;
    // Changes of one kind in ascending size (tensor parallelism 1, context 2, expert 3;
    // 0 alone):
    // when the largest does not fit, no smaller one does, and none is planned.
    int kind = 0;
  };
  const int global = base.global_batch > 0 ? base.global_batch
                                           : base.micro_batch * plan_mesh(base).data_parallel_size();
  const auto with_checkpointing = [](RunPlanRequest r) {
    r.model.activation_checkpointing = true;
    return r;
  };
  const auto in_bf16 = [](RunPlanRequest r) {
    r.model.precision = r.strategy.param_dtype = DType::bf16;
    return r;
  };
  const auto with_micro_batch = [&](RunPlanRequest r, int mb) {
    r.micro_batch = mb;
    r.global_batch = global;
    return r;
  };
  const auto on_ranks = [&](RunPlanRequest r, int n) {
    r.world_size = n;
    r.global_batch = std::max(global, r.micro_batch * n);
    return r;
  };
  std::vector<Change> changes;
  if (!checkpointing_tried) changes.push_back({"--activation-checkpointing", with_checkpointing(base)});
  if (base.model.precision == DType::fp32) changes.push_back({"--precision bf16", in_bf16(base)});
  for (int mb = base.micro_batch / 2; mb >= 1; mb /= 2)
    changes.push_back({fmt::format("--micro-batch {}", mb), with_micro_batch(base, mb)});
  if (!tensor_tried)
    for (int T : tensor_parallel_choices(base, cluster)) {
      if (T == base.strategy.tensor_parallel) continue;
      RunPlanRequest r = base;
      r.strategy.tensor_parallel = T;
      changes.push_back({fmt::format("--tensor-parallel {}", T), r, 1});
    }
  if (!expert_tried)
    for (int E : expert_parallel_choices(base)) {
      if (E == base.strategy.expert_parallel) continue;
      RunPlanRequest r = base;
      r.strategy.expert_parallel = E;
      changes.push_back({fmt::format("--expert-parallel {}", E), r, 3});
    }
  if (!context_tried)
    for (int P : context_parallel_choices(base, cluster)) {
      RunPlanRequest r = base;
      r.strategy.context_parallel = P;
      const ContextLayout l = *context_layout(base, P, base.strategy.tensor_parallel);
      r.model.context_parallel_kind = l.kind;
      r.model.ulysses_degree = l.ulysses_degree;
      changes.push_back({fmt::format("--context-parallel {}{}", P, context_flags(l)), r, 2});
    }
  for (int n = base.world_size * 2; n <= 4096; n *= 2)
    changes.push_back({fmt::format("-n {}", n), on_ranks(base, n)});
  // All of them together, naming only the flags that change something (a bf16 run
  // is not told to use bf16).
  RunPlanRequest all = with_micro_batch(in_bf16(checkpointing_tried ? base : with_checkpointing(base)), 1);
  std::string all_flags;
  if (!checkpointing_tried) all_flags += "--activation-checkpointing ";
  if (base.model.precision == DType::fp32) all_flags += "--precision bf16 ";
  if (base.micro_batch > 1) all_flags += "--micro-batch 1 ";
  for (int n = base.world_size * 2; n <= 4096; n *= 2)
    changes.push_back({fmt::format("{}-n {}", all_flags, n), on_ranks(all, n)});
  const int ranks_per_node = std::max(1, base.world_size / std::max(1, cluster.nodes));
  // The candidate that fits with `change` and is chosen among those that do, if any.
  const auto fitting = [&](const Change& change) -> std::optional<std::string> {
    ClusterShape scaled = cluster;
    scaled.nodes = std::max(1, change.request.world_size / ranks_per_node);
    // Each change is judged as the candidates were: with their checkpointing variants.
    const auto candidates = plan_candidates(change.request, profile, scaled, checkpointing_tried);
    std::vector<size_t> eligible;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (fits(candidates[i], budget)) eligible.push_back(i);
    if (eligible.empty()) return std::nullopt;
    const Candidate& best = candidates[pick(candidates, eligible)];
    return fmt::format("{}: {}", best.label, gib(best.plan.total()));
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& change = changes[i];
    if (change.kind != 0 && (i == 0 || changes[i - 1].kind != change.kind)) {
      size_t largest = i;
      while (largest + 1 < changes.size() && changes[largest + 1].kind == change.kind) ++largest;
      if (largest != i && !fitting(changes[largest])) {
        i = largest;  // none of this kind fits
        continue;
      }
    }
    if (const auto best = fitting(change))
      return fmt::format("the smallest change that fits is {} ({})", change.flags, *best);
  }
  return "no change tried fits (activation checkpointing, bf16, micro-batch 1, tensor and "
         "context parallelism inside a node, expert parallelism, up to 4096 ranks)";
}

}  // namespace

std::string candidate_flags(const Candidate& c) {
  const StrategyOptions& s = c.request.strategy;
  std::string flags = "--strategy " + to_string(s.kind);
  if (s.kind == StrategyKind::hybrid) flags += fmt::format(" --shard-group-size {}", s.shard_group_size);
  if (shards_parameters(s.kind) && !s.reshard_after_forward)
    flags += " --reshard-after-forward false";
  if (s.tensor_parallel > 1) flags += fmt::format(" --tensor-parallel {}", s.tensor_parallel);
  if (s.tensor_parallel > 1 && c.request.model.sequence_parallel) flags += " --sequence-parallel";
  if (s.expert_parallel > 1) flags += fmt::format(" --expert-parallel {}", s.expert_parallel);
  if (s.context_parallel > 1)
    flags += fmt::format(" --context-parallel {}{}", s.context_parallel,
                         context_flags({c.request.model.context_parallel_kind,
                                        c.request.model.ulysses_degree}));
  if (c.request.model.activation_checkpointing) flags += " --activation-checkpointing";
  return flags;
}

std::vector<Candidate> plan_candidates(const RunPlanRequest& base, const HardwareProfile* profile,
                                       const ClusterShape& cluster, bool vary_checkpointing,
                                       const std::vector<int>& tensor_sizes,
                                       const std::vector<int>& context_sizes,
                                       const std::vector<int>& expert_sizes) {
  std::vector<bool> checkpointing = {base.model.activation_checkpointing};
  if (vary_checkpointing && !base.model.activation_checkpointing) checkpointing.push_back(true);
  const auto or_base = [](const std::vector<int>& sizes, int asked) {
    return sizes.empty() ? std::vector<int>{asked} : sizes;
  };
  const std::vector<int> Ts = or_base(tensor_sizes, base.strategy.tensor_parallel);
  const std::vector<int> Ps = or_base(context_sizes, base.strategy.context_parallel);
  const std::vector<int> Es = or_base(expert_sizes, base.strategy.expert_parallel);
  // Every candidate runs base's global batch (by default a micro-batch per data-parallel
  // rank of base's layout), so that their step times compare the same tokens; a tensor
  // or context size the batch does not split over is left out.
  const int global = base.global_batch > 0 ? base.global_batch
                                           : base.micro_batch * plan_mesh(base).data_parallel_size();
  std::vector<Candidate> out;
  for (bool ckpt : checkpointing)
    for (int P : Ps)
      for (int T : Ts)
        for (int E : Es) {
          if (base.world_size % (P * T) != 0) continue;
          const bool experts_spread = E > 1;
          const bool varied = T != base.strategy.tensor_parallel || P != base.strategy.context_parallel ||
                              E != base.strategy.expert_parallel;
          if (varied && global % (base.micro_batch * (base.world_size / (P * T))) != 0) continue;
          // Sequence parallelism splits a rank's tokens over the tensor ranks.
          if (base.model.sequence_parallel && T > 1 &&
              static_cast<int64_t>(base.micro_batch) * base.seq_len / P % T != 0)
            continue;
          // Another context size runs the kind its heads allow.
          std::optional<ContextLayout> context;
          if (P != base.strategy.context_parallel && P > 1) {
            context = context_layout(base, P, T);
            if (!context) continue;
          }
          // Hybrid groups share out the data-parallel ranks (context ranks split
          // sequences, tensor ranks the layers).
          for (const Choice& choice : strategy_choices(base.world_size / (P * T))) {
            Candidate c;
            c.request = base;
            if (context) {
              c.request.model.context_parallel_kind = context->kind;
              c.request.model.ulysses_degree = context->ulysses_degree;
            }
            const ContextLayout kind{c.request.model.context_parallel_kind, c.request.model.ulysses_degree};
            c.label = choice.label + (T > 1 ? fmt::format(" x tp{}", T) : "") +
                      (experts_spread ? fmt::format(" x ep{}", E) : "") +
                      (P > 1 ? fmt::format(" x cp{}{}", P, context_label(kind)) : "") +
                      (ckpt && !base.model.activation_checkpointing ? " + ckpt" : "");
            c.request.strategy.kind = choice.kind;
            c.request.strategy.reshard_after_forward = choice.reshard;
            c.request.strategy.shard_group_size = choice.group;
            c.request.strategy.context_parallel = P;
            c.request.strategy.tensor_parallel = T;
            c.request.strategy.expert_parallel = E;
            // The expert ranks are carved out of the data-parallel ones (of each shard
            // group under hybrid): a layout the mesh refuses is no candidate.
            if (experts_spread && !lays_out(c.request)) continue;
            if (varied) c.request.global_batch = global;
            c.request.model.activation_checkpointing = ckpt;
            c.plan = plan_run(c.request);
            if (profile != nullptr) c.time = predict_step_time(c.plan, *profile, cluster);
            out.push_back(std::move(c));
          }
        }
  return out;
}

namespace {

int ranks_per_node(const RunPlanRequest& base, const ClusterShape& cluster) {
  const int nodes = std::max(1, cluster.nodes);
  return base.world_size % nodes == 0 ? base.world_size / nodes : base.world_size;
}

}  // namespace

std::vector<int> tensor_parallel_choices(const RunPlanRequest& base, const ClusterShape& cluster) {
  if (base.strategy.tensor_parallel > 1) return {base.strategy.tensor_parallel};
  const int node = ranks_per_node(base, cluster);
  const int data = base.world_size / base.strategy.context_parallel;
  std::vector<int> out = {1};
  for (int T = 2; T <= node; ++T)
    if (node % T == 0 && data % T == 0 && accepted([&] { check_tensor_parallel(base.config, T); }) &&
        (!base.model.sequence_parallel || rank_tokens(base) % T == 0))
      out.push_back(T);
  return out;
}

std::optional<ContextLayout> context_layout(const RunPlanRequest& base, int P, int T) {
  const auto fits_model = [&](const ContextLayout& l) {
    return accepted([&] { check_context_parallel_model(base.config, P, l.kind, T, l.ulysses_degree); }) &&
           accepted([&] {
             ContextSplit(0, P, zigzag_split(l.kind), split_ulysses_degree(l.kind, l.ulysses_degree))
                 .check_seq_len(base.seq_len);
           });
  };
  std::vector<ContextLayout> kinds;
  if (base.model.context_parallel_kind != ContextParallelKind::ulysses) {
    kinds.push_back({base.model.context_parallel_kind, base.model.ulysses_degree});
  } else {
    kinds.push_back({ContextParallelKind::ulysses, 1});
    for (int U = P / 2; U >= 2; --U)
      if (P % U == 0) kinds.push_back({ContextParallelKind::hybrid, U});
    kinds.push_back({ContextParallelKind::ring, 1});
  }
  for (const ContextLayout& l : kinds)
    if (fits_model(l)) return l;
  return std::nullopt;
}

std::vector<int> context_parallel_choices(const RunPlanRequest& base, const ClusterShape& cluster) {
  if (base.strategy.context_parallel > 1) return {};
  const int node = ranks_per_node(base, cluster);
  const int T = base.strategy.tensor_parallel;
  std::vector<int> out;
  for (int P = 2; P <= node; ++P)
    if (node % P == 0 && base.world_size % (P * T) == 0 && context_layout(base, P, T) &&
        (!base.model.sequence_parallel || rank_tokens(base) / P % T == 0))
      out.push_back(P);
  return out;
}

std::vector<int> expert_parallel_choices(const RunPlanRequest& base) {
  const StrategyOptions& s = base.strategy;
  if (s.expert_parallel > 1 || !base.config.moe.enabled()) return {s.expert_parallel};
  // The divisors of the data-parallel ranks, and beyond them those that take in the
  // context ranks too where base's mesh lays them out (multiples of P: Megatron-core's
  // EP over DP x CP).
  const int ranks = base.world_size / s.tensor_parallel;
  const int data = ranks / s.context_parallel;
  std::vector<int> out = {1};
  for (int E = 2; E <= ranks; ++E) {
    if (ranks % E != 0 || base.config.moe.num_experts % E != 0) continue;
    RunPlanRequest spanning = base;
    spanning.strategy.expert_parallel = E;
    if (data % E == 0 || lays_out(spanning)) out.push_back(E);
  }
  return out;
}

AutoSearch auto_search(const RunPlanRequest& base, const HardwareProfile* profile,
                       const ClusterShape& cluster, const MemoryBudget& budget) {
  AutoSearch out;
  const std::vector<int> tensor_sizes = tensor_parallel_choices(base, cluster);
  const std::vector<int> expert_sizes = expert_parallel_choices(base);
  out.candidates = plan_candidates(base, profile, cluster, /*vary_checkpointing=*/true, tensor_sizes,
                                   {}, expert_sizes);
  out.recommendation = recommend(out.candidates, budget, base, profile, cluster);
  if (out.recommendation.chosen) return out;
  // The sequence does not fit whole on any rank: split it too (the kind each P allows).
  const std::vector<int> context_sizes = context_parallel_choices(base, cluster);
  if (context_sizes.empty()) return out;
  std::vector<Candidate> split = plan_candidates(base, profile, cluster, /*vary_checkpointing=*/true,
                                                 tensor_sizes, context_sizes, expert_sizes);
  const Recommendation with_context = recommend(split, budget, base, profile, cluster);
  if (!with_context.chosen) return out;
  const size_t whole = out.candidates.size();
  for (Candidate& c : split) out.candidates.push_back(std::move(c));
  out.recommendation = {whole + *with_context.chosen,
                        with_context.explanation + " (no layout fits without --context-parallel)"};
  return out;
}

Recommendation recommend(const std::vector<Candidate>& candidates, const MemoryBudget& budget_bytes,
                         const RunPlanRequest& base, const HardwareProfile* profile,
                         const ClusterShape& cluster) {
  Recommendation out;
  std::vector<size_t> eligible;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (fits(candidates[i], budget_bytes)) eligible.push_back(i);
  if (!eligible.empty()) {
    out.chosen = pick(candidates, eligible);
    out.explanation = why_chosen(candidates, eligible, *out.chosen, budget_bytes);
    return out;
  }
  size_t smallest = 0;
  bool checkpointing_tried = false, tensor_tried = false, expert_tried = false, context_tried = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const RunPlanRequest& r = candidates[i].request;
    if (candidates[i].plan.total() < candidates[smallest].plan.total()) smallest = i;
    checkpointing_tried = checkpointing_tried || r.model.activation_checkpointing;
    tensor_tried = tensor_tried || r.strategy.tensor_parallel != base.strategy.tensor_parallel;
    expert_tried = expert_tried || r.strategy.expert_parallel != base.strategy.expert_parallel;
    context_tried = context_tried || r.strategy.context_parallel != base.strategy.context_parallel;
  }
  // Candidates whose device side fits but whose host side does not: say so (the
  // device-only changes of step 4 cannot help them).
  std::optional<size_t> device_fits;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (budget_bytes.fits_device(candidates[i].plan) &&
        (!device_fits || candidates[i].plan.host.total() < candidates[*device_fits].plan.host.total()))
      device_fits = i;
  if (device_fits) {
    const RunPlan& p = candidates[*device_fits].plan;
    out.explanation = fmt::format(
        "nothing fits in host memory: {} fits in {} per rank on the device but needs {} of host "
        "memory per node ({} ranks x {}), the node has {}",
        candidates[*device_fits].label, gib(budget_bytes.per_rank),
        gib(budget_bytes.host_per_node_of(p)), budget_bytes.ranks_per_node, gib(p.host.total()),
        gib(budget_bytes.host_per_node));
    return out;
  }
  out.explanation = fmt::format(
      "nothing fits in {} per rank (the smallest, {}, needs {}): {}", gib(budget_bytes.per_rank),
      candidates.empty() ? "-" : candidates[smallest].label,
      candidates.empty() ? "-" : gib(candidates[smallest].plan.total()),
      smallest_change(base, checkpointing_tried, tensor_tried, expert_tried, context_tried, profile,
                      cluster, budget_bytes));
  return out;
}

}  // namespace shardlm
