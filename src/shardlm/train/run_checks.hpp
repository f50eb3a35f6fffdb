// Checks a training run makes before it touches anything: a checkpoint against the
// run that wants to resume it, and every rank against rank 0. (The flags' own ranges:
// TrainOptions::validate; threads: thread_budget.hpp.)
#pragma once

#include <nlohmann/json.hpp>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

// Compares the options that fix a run's trajectory (`wanted`, TrainOptions::
// trajectory_json of the resolved options) and the model against a checkpoint's.
void check_resume_compatible(const CheckpointReader& ckpt, const ModelConfig& config,
                             const nlohmann::json& wanted, const std::string& tokenizer);

// Start-up agreement: rank 0's view of the run against this rank's; the first field
// that differs is named.
void check_ranks_agree(Communicator& comm, const nlohmann::json& mine);

}  // namespace shardlm
