// Which strategy a run should use, and why, in one line: `shardlm plan`'s
// recommendation and `shardlm train --strategy auto`'s choice (docs/planning.md has
// the decision tree and where it departs from the usual advice).
//
//  1. Candidates: ddp, zero1, zero2, zero3, zero3 keeping parameters gathered from
//     forward to backward, hybrid for each shard group size that divides the ranks;
//     each as asked and, unless asked already, with activation checkpointing; under
//     --strategy auto each at every tensor-parallel size inside a node and, for a
//     mixture of experts, every expert-parallel size, and, when none of those fits, at
//     every context-parallel size too, each with the context-parallel kind its heads
//     allow (auto_search); expert parallelism with each of those, with checkpointing and
//     with hybrid, wherever the mesh lays it out.
//  2. Those whose planned bytes per rank fit the budget are eligible (a device run's
//     host side too: its host bytes per rank times the ranks on a node within the
//     node's host memory, where that is known).
//  3. With a step-time model, the fastest eligible candidate wins: no candidate that
//     fits is predicted faster than the one chosen. Step times within 1% of each
//     other are equally fast (the model does not resolve less); among those, and
//     without a step-time model among all eligible, the fewest bytes on the wire win,
//     then the simpler (in the order above; the rule of thumb: replicate what fits,
//     shard only what must be).
//  4. Nothing fits: the smallest change that makes something fit is named, trying
//     in order activation checkpointing, bf16, halving the micro-batch (more
//     accumulation steps), --tensor-parallel T, --expert-parallel E,
//     --context-parallel P, and doubling the ranks.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "shardlm/model/model.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/plan/time_model.hpp"

namespace shardlm {

struct Candidate {
  std::string label;       // "zero3", "zero3 no-reshard", "hybrid 8", "+ ckpt" suffix
  RunPlanRequest request;
  RunPlan plan;
  std::optional<StepTimePrediction> time;
};

// The candidates of step 1 for `base` (its strategy options other than kind,
// resharding and group size are kept), each planned and, with a profile, timed; for
// each tensor-parallel size in tensor_sizes, context-parallel size in context_sizes and
// expert-parallel size in expert_sizes (empty: base's), T = 1, P = 1 and E = 1 first.
// A context size other than base's runs the kind context_layout gives it; a layout
// with E > 1 that strategy_mesh refuses (E not dividing the data-parallel ranks, or a
// hybrid shard group) is left out.
std::vector<Candidate> plan_candidates(const RunPlanRequest& base, const HardwareProfile* profile,
                                       const ClusterShape& cluster, bool vary_checkpointing,
                                       const std::vector<int>& tensor_sizes = {},
                                       const std::vector<int>& context_sizes = {},
                                       const std::vector<int>& expert_sizes = {});

// The tensor-parallel sizes --strategy auto considers: 1 and the divisors of a node's
// ranks (the tensor group stays inside a node) that divide the data-parallel ranks and
// split the model (check_tensor_parallel) and, with --sequence-parallel, a rank's
// tokens; base's alone when it fixes one (> 1).
std::vector<int> tensor_parallel_choices(const RunPlanRequest& base, const ClusterShape& cluster);
// The context-parallel sizes > 1 it tries when no candidate fits: divisors of a node's
// ranks for which context_layout finds a kind; none when base fixes one.
std::vector<int> context_parallel_choices(const RunPlanRequest& base, const ClusterShape& cluster);
// The expert-parallel sizes it considers for a mixture of experts: 1 and every E > 1
// dividing the experts of a layer and base's data-parallel ranks (the world over its
// context and tensor sizes), or beyond them taking in the context ranks where base's
// mesh lays that out (strategy_mesh); base's alone when it fixes one (> 1) or when the
// model is dense. An offloaded optimizer combines with every E (its host state holds the
// experts the rank holds).
// plan_candidates leaves out the sizes another context size or a hybrid group does not
// lay out.
std::vector<int> expert_parallel_choices(const RunPlanRequest& base);

// How P context ranks at T tensor ranks split the attention: base's kind when it names
// ring or hybrid; else Ulysses where a tensor rank's heads split over P, else hybrid with
// the largest Ulysses degree U (1 < U < P, dividing P) they split over, else ring; none
// when no kind fits the heads and the sequence (check_context_parallel_model,
// ContextSplit::check_seq_len).
struct ContextLayout {
  ContextParallelKind kind = ContextParallelKind::ulysses;
  int ulysses_degree = 1;
};
std::optional<ContextLayout> context_layout(const RunPlanRequest& base, int P, int T);

// What a candidate must fit in. Implicit from a device budget alone (host unbounded).
struct MemoryBudget {
  MemoryBudget(double device_per_rank = std::numeric_limits<double>::infinity())
      : per_rank(device_per_rank) {}
  double per_rank;  // bytes per rank on the run's device (the host's for --device cpu)
  // A device run's host memory per node (infinite: unknown) and the ranks on a node.
  double host_per_node = std::numeric_limits<double>::infinity();
  int ranks_per_node = 1;
  bool fits_device(const RunPlan& p) const { return static_cast<double>(p.total()) <= per_rank; }
  double host_per_node_of(const RunPlan& p) const {
    return static_cast<double>(p.host.total()) * ranks_per_node;
  }
  bool fits_host(const RunPlan& p) const { return host_per_node_of(p) <= host_per_node; }
  bool fits(const RunPlan& p) const { return fits_device(p) && fits_host(p); }
};

struct Recommendation {
  std::optional<size_t> chosen;  // index into the candidates
  std::string explanation;       // one line: "<label>: <why>"
};

// Steps 2-4. base and profile/cluster only serve step 4.
Recommendation recommend(const std::vector<Candidate>& candidates, const MemoryBudget& budget,
                         const RunPlanRequest& base, const HardwareProfile* profile,
                         const ClusterShape& cluster);

// --strategy auto (train's and plan's): the candidates over tensor_parallel_choices and
// expert_parallel_choices, recommended; when none fits, also those over
// context_parallel_choices (the sequence split too), appended, and the recommendation
// among them.
struct AutoSearch {
  std::vector<Candidate> candidates;
  Recommendation recommendation;
};
AutoSearch auto_search(const RunPlanRequest& base, const HardwareProfile* profile,
                       const ClusterShape& cluster, const MemoryBudget& budget);

// The `train` flags that select a candidate: "--strategy hybrid --shard-group-size 8
// --activation-checkpointing", "--strategy zero3 --expert-parallel 8", "--strategy zero3
// --context-parallel 8 --context-parallel-kind hybrid --ulysses-degree 4".
std::string candidate_flags(const Candidate& candidate);

std::string gib(double bytes);  // "9.1 GiB"; "5.3 MiB" below 1 GiB
std::string format_step_time(double seconds);  // "279.4 s" from 10 s, "268 ms", "19.7 ms" below 0.1 s

}  // namespace shardlm
