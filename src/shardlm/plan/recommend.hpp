// Which strategy a run should use, and why, in one line: `shardlm plan`'s
// recommendation and `shardlm train --strategy auto`'s choice (docs/planning.md has
// the decision tree and where it departs from the usual advice).
//
//  1. Candidates: ddp, zero1, zero2, zero3, zero3 keeping parameters gathered from
//     forward to backward, hybrid for each shard group size that divides the ranks;
//     each as asked and, unless asked already, with activation checkpointing.
//  2. Those whose planned bytes per rank fit the budget are eligible.
//  3. With a step-time model, the fastest eligible candidate wins: no candidate that
//     fits is predicted faster than the one chosen. Step times within 1% of each
//     other are equally fast (the model does not resolve less); among those, and
//     without a step-time model among all eligible, the fewest bytes on the wire win,
//     then the simpler (in the order above; the rule of thumb: replicate what fits,
//     shard only what must be).
//  4. Nothing fits: the smallest change that makes something fit is named, trying
//     in order activation checkpointing, bf16, halving the micro-batch (more
//     accumulation steps), and doubling the ranks.
#pragma once

#include <optional>
#include <string>
#include <vector>

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
// resharding and group size are kept), each planned and, with a profile, timed.
std::vector<Candidate> plan_candidates(const RunPlanRequest& base, const HardwareProfile* profile,
                                       const ClusterShape& cluster, bool vary_checkpointing);

struct Recommendation {
  std::optional<size_t> chosen;  // index into the candidates
  std::string explanation;       // one line: "<label>: <why>"
};

// Steps 2-4. budget_bytes per rank; base and profile/cluster only serve step 4.
Recommendation recommend(const std::vector<Candidate>& candidates, double budget_bytes,
                         const RunPlanRequest& base, const HardwareProfile* profile,
                         const ClusterShape& cluster);

// The `train` flags that select a candidate: "--strategy hybrid --shard-group-size 8
// --activation-checkpointing".
std::string candidate_flags(const Candidate& candidate);

std::string gib(double bytes);  // "9.1 GiB"; "5.3 MiB" below 1 GiB

}  // namespace shardlm
