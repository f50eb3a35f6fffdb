// Test-only fault injection. Code marks points where a crash must be survivable
// (e.g. the stages of a checkpoint commit); the environment variable
// SHARDLM_FAULT=<point>[:exit] makes the process fail there: by throwing Error
// (default) or by exiting at once with status 43, as a killed process would,
// without unwinding or flushing anything. SHARDLM_FAULT=<point>=<value> instead asks
// the code at a point for a test action that takes a value (fault_value).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardlm {

void fault_point(std::string_view point);

// The value of SHARDLM_FAULT=<point>=<value> when it names `point`, else nullopt.
// Points: save_after_load=DIR (the trainer writes the state it just loaded from a
// checkpoint, under this run's layout, as a checkpoint under DIR, so a test can check
// that resharding on load changed no bit); diverge_replica=RANK (with --check-replicas,
// that rank changes its first owned parameter after every step, so the check must
// catch a replica that went its own way); hold_for_signal=RANK:STEP (that rank waits
// for a stop signal after STEP steps, train/stop_signals.hpp).
std::optional<std::string> fault_value(std::string_view point);

// SHARDLM_FAULT_STEP="RANK:STEP[:always]" makes that rank exit at once (status 43)
// when it reaches optimizer step STEP (1-based), in the first attempt of a `shardlm
// launch` job only (SHARDLM_RESTART_COUNT unset or 0, so a restart gets past it)
// unless ":always".
void fault_at_step(int rank, int64_t step);

// SHARDLM_FAULT_DISK_FULL=SUBSTRING: every write through File (core/file_util.hpp) to a
// path that contains SUBSTRING fails as write(2) does on a full disk (ENOSPC), so a test
// sees what a job leaves when its disk fills without mounting a small file system.
bool disk_full_injected(std::string_view path);

}  // namespace shardlm
