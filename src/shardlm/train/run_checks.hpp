// Checks a training run makes before it touches anything: options against the model,
// a checkpoint against the run that wants to resume it, and every rank against rank
// 0; and the thread budget of a rank.
#pragma once

#include <nlohmann/json.hpp>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

// Error naming the first flag out of range.
void validate_options(const TrainOptions& o, const ModelConfig& config);

// Compares the options that fix a run's trajectory (`wanted`, TrainOptions::
// trajectory_json of the resolved options) and the model against a checkpoint's.
void check_resume_compatible(const CheckpointReader& ckpt, const ModelConfig& config,
                             const nlohmann::json& wanted, const std::string& tokenizer);

// Start-up agreement: rank 0's view of the run against this rank's; the first field
// that differs is named.
void check_ranks_agree(Communicator& comm, const nlohmann::json& mine);

// Cores this process may run on (its affinity mask).
int available_cores();
// Ranks of this job on this machine (Open MPI tells; otherwise assume all).
int local_ranks(int world_size);

}  // namespace shardlm
