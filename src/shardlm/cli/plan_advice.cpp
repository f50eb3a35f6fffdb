#include "shardlm/cli/plan_advice.hpp"

#include <fmt/format.h>

#include <cmath>

#include "shardlm/core/error.hpp"

namespace shardlm::cli {

namespace {

// recommend() for `run` on `ranks` over `profile`'s nodes, as `plan` recommends for its
// own flags (the same candidates, the same budget; --strategy auto's search for auto).
using Planned = AutoSearch;

Planned plan_job(const TrainOptions& run, int ranks, const ProfileOptions& profile_options,
                 const MemoryBudget& budget) {
  const PlanInputs in = resolve_plan_inputs(run, ranks, profile_options);
  const HardwareProfile* profile = in.profile ? &*in.profile : nullptr;
  if (run.strategy == "auto") return auto_search(in.request, profile, in.cluster, budget);
  Planned p;
  p.candidates = plan_candidates(in.request, profile, in.cluster, /*vary_checkpointing=*/true);
  p.recommendation = recommend(p.candidates, budget, in.request, profile, in.cluster);
  return p;
}

// The seed documents' LoRA rank (and ms-swift's default).
constexpr int kSuggestedLoraRank = 8;

}  // namespace

std::vector<PlannedAlternative> plan_alternatives(const PlannedJob& job) {
  struct Move {
    std::string name, flags;
    TrainOptions run;
  };
  std::vector<Move> moves;
  const TrainOptions& run = job.run;
  if (run.lora_rank == 0) {
    TrainOptions lora = run;
    lora.lora_rank = kSuggestedLoraRank;
    moves.push_back({"LoRA (fine-tuning)", fmt::format("--lora-rank {}", kSuggestedLoraRank), lora});
  }
  if (run.quantize_base == "none") {
    TrainOptions qlora = run;
    qlora.lora_rank = run.lora_rank > 0 ? run.lora_rank : kSuggestedLoraRank;
    qlora.quantize_base = "nf4";
    moves.push_back({"QLoRA (fine-tuning)",
                     run.lora_rank > 0 ? "--quantize-base nf4"
                                       : fmt::format("--lora-rank {} --quantize-base nf4", kSuggestedLoraRank),
                     qlora});
  }
  if (run.device != "cpu" && run.offload == Offload::none) {
    TrainOptions offload = run;
    offload.offload = Offload::optimizer;
    moves.push_back({"optimizer in host memory", "--offload optimizer", offload});
  }
  std::vector<PlannedAlternative> out;
  for (const Move& move : moves) {
    Planned p;
    try {
      p = plan_job(move.run, job.ranks, job.profile, job.budget);
    } catch (const Error& e) {  // a move this model or these flags do not take
      out.push_back({move.name, move.flags, false, "", fmt::format("cannot be planned: {}", e.what())});
      continue;
    }
    PlannedAlternative a{move.name, move.flags, p.recommendation.chosen.has_value(), "",
                         p.recommendation.explanation};
    if (a.fits) a.candidate_flags = candidate_flags(p.candidates[*p.recommendation.chosen]);
    out.push_back(std::move(a));
  }
  return out;
}

std::optional<std::string> second_node_slowdown(const PlannedJob& job, const Candidate& chosen) {
  const int nodes = job.profile.nodes;
  if (nodes <= 1 || !chosen.time) return std::nullopt;
  // The first node alone: its ranks run the same global batch (more accumulation steps);
  // any strategy that fits them (the mesh and group size of the asked run may not).
  const int ranks = job.ranks / nodes;
  const int global_batch = static_cast<int>(std::llround(chosen.plan.tokens_per_step / chosen.request.seq_len));
  TrainOptions one = job.run;
  one.strategy = "auto";
  one.mesh.clear();
  one.shard_group_size = 0;
  one.grad_accum = 0;
  one.global_batch = global_batch;
  ProfileOptions one_node = job.profile;
  one_node.nodes = 1;
  one_node.link.clear();
  MemoryBudget budget = job.budget;
  budget.ranks_per_node = ranks;
  const Planned p = plan_job(one, ranks, one_node, budget);
  if (!p.recommendation.chosen) return std::nullopt;
  const Candidate& alone = p.candidates[*p.recommendation.chosen];
  if (!alone.time || alone.time->step_s >= chosen.time->step_s) return std::nullopt;
  return fmt::format(
      "the second node slows this job down: {} nodes x {} ranks ({}) are predicted at {} per step, the "
      "first node alone ({} ranks, the same {} sequences per step, {}) at {} per step, {:.1f}x faster; "
      "run on one node (-n {} --nodes 1 --global-batch {}) or over a faster link (--link)",
      nodes, ranks, chosen.label, format_step_time(chosen.time->step_s), ranks, global_batch,
      candidate_flags(alone), format_step_time(alone.time->step_s),
      chosen.time->step_s / alone.time->step_s, ranks, global_batch);
}

}  // namespace shardlm::cli
