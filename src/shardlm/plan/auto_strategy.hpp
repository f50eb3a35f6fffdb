// `shardlm train --strategy auto`: the run takes `shardlm plan`'s recommendation
// (plan/recommend.hpp, the same candidates and rule) for this job and says why.
//
// Inputs: the run's own flags and world size; the memory budget per rank is
// --memory-per-rank, else the least, over the job's hosts, of a host's available memory
// (MemAvailable) shared among the ranks on it; the hardware profile is the calibrated
// one where `plan` looks for it (plan/hardware_profile.hpp default_profile_path()),
// else none (then the fewest bytes on the wire decide, as in `plan` without a profile).
// Rank 0 decides and broadcasts, so every rank runs the same strategy even when hosts
// differ in memory or profile files. The trainer (below plan) gets it from the
// subcommand as RunSetup::resolve_options (train/trainer.hpp).
#pragma once

#include <string>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

// Collective. Returns `o` with strategy, reshard_after_forward, shard_group_size,
// activation_checkpointing, tensor_parallel, sequence_parallel (only at T > 1),
// expert_parallel, context_parallel, context_parallel_kind and ulysses_degree set to the
// chosen candidate, the global batch to the one plan planned (--grad-accum, if given,
// becomes it), and strategy_reason to the line printed (rank 0 prints "strategy auto -> <label>: <why>"). Error on every rank,
// one line naming the smallest change that fits, when no candidate fits the budget.
// `o` unchanged when its strategy is not "auto".
TrainOptions resolve_auto_strategy(const TrainOptions& o, Communicator& comm);

}  // namespace shardlm
