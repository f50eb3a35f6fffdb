// From a run's flags (TrainOptions, the same `train` takes) to what the planner needs:
// the RunPlanRequest, the hardware profile and the cluster shape. Shared by `plan`,
// `bench` and `train --strategy auto`.
#pragma once

#include <optional>
#include <string>

#include "shardlm/plan/hardware_profile.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/plan/time_model.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

struct ProfileOptions {
  std::string profile;  // built-in name or file; "" : the calibrated default if present
  int nodes = 1;
  std::string link;     // "" : the profile's inter-node transport
};

struct PlanInputs {
  ModelConfig config;
  RunPlanRequest request;  // --strategy auto plans as ddp (the candidates vary it)
  std::optional<HardwareProfile> profile;
  ClusterShape cluster;
};

// Validates the flags the planner reads (one-line errors naming them). The
// vocabulary is the data's when o.data_dir is set, else the preset's.
PlanInputs resolve_plan_inputs(const TrainOptions& o, int world_size, const ProfileOptions& p);

// The request for a resolved config and world size (strategy "auto" as ddp).
RunPlanRequest plan_request(const TrainOptions& o, const ModelConfig& config, int world_size);

// The profile named by `flag`, or the calibrated one at default_profile_path() when
// `flag` is empty and that file exists, or none.
std::optional<HardwareProfile> resolve_profile(const std::string& flag);

}  // namespace shardlm
