// The hardware-profile and cluster flags `plan`, `bench` and `train` share.
#pragma once

#include <CLI/CLI.hpp>

#include "shardlm/plan/plan_inputs.hpp"

namespace shardlm::cli {

// --profile, --nodes, --link
void add_profile_flags(CLI::App& cmd, ProfileOptions& flags);

}  // namespace shardlm::cli
