// What `plan` says beside its recommendation (docs/planning.md, "Beyond the
// recommendation"), each claim planned with the flags it names, never guessed:
//  - nothing fits: the seed documents' decision tree's other moves where they fit:
//    for fine-tuning LoRA (--lora-rank 8) and QLoRA (and --quantize-base nf4), on a
//    device --offload optimizer;
//  - a job over several nodes that the first node alone (its ranks, the same global
//    batch) is predicted to run faster: the inter-node link costs more than the
//    second node's compute saves.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardlm/plan/plan_inputs.hpp"
#include "shardlm/plan/recommend.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm::cli {

// The run `plan` was asked about: its flags, ranks, profile and cluster, and the budget.
struct PlannedJob {
  TrainOptions run;
  int ranks = 1;
  ProfileOptions profile;
  MemoryBudget budget;
};

// One move of the decision tree, planned: the flags added, and recommend()'s line for
// the run with them (a candidate's "why", or what would still be needed).
struct PlannedAlternative {
  std::string move;   // "LoRA (fine-tuning)"
  std::string flags;  // "--lora-rank 8"
  bool fits = false;
  std::string candidate_flags;  // the candidate's train flags, when it fits
  std::string explanation;
};

// The moves that apply to `job` (LoRA when it trains every weight, QLoRA unless its
// base is quantized already, --offload optimizer on a device when not offloaded), each
// with the recommendation for the run with its flags.
std::vector<PlannedAlternative> plan_alternatives(const PlannedJob& job);

// With a profile and more than one node, when `chosen` (the job's recommended
// candidate) is predicted slower than the best candidate that fits on the first node
// alone: one line naming both step times; nullopt otherwise (one node, no times,
// nothing that fits on one node, or the job is faster).
std::optional<std::string> second_node_slowdown(const PlannedJob& job, const Candidate& chosen);

}  // namespace shardlm::cli
