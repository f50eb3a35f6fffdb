// Test-only fault injection. Code marks points where a crash must be survivable
// (e.g. the stages of a checkpoint commit); the environment variable
// SHARDLM_FAULT=<point>[:exit] makes the process fail there: by throwing Error
// (default) or by exiting at once with status 43, as a killed process would,
// without unwinding or flushing anything.
#pragma once

#include <string_view>

namespace shardlm {

void fault_point(std::string_view point);

}  // namespace shardlm
