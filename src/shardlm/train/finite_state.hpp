// The check that keeps a diverged run from committing: after an update, before a
// checkpoint is written, every rank scans its owned slices (fp32 master weights and
// AdamW moments) and the ranks agree on the outcome (one small all-gather).
#pragma once

#include <cstdint>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/owned_state.hpp"

namespace shardlm {

// Error on every rank, "training diverged at step N: ... not finite ..." naming the
// first rank, unit and state found, when any owned element is NaN or infinite.
void check_state_finite(const ParamLayout& layout, OwnedState& state, Communicator& comm,
                        int64_t step);

}  // namespace shardlm
