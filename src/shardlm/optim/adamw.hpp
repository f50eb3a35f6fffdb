// AdamW on flat fp32 slices (the rank's owned state), with decoupled weight decay
// applied only where a parameter asks for it (2-D weights), as PyTorch's AdamW. The
// update itself is the backend's (the CPU kernel: backend/cpu/adamw.hpp); this is
// which elements decay, and gradient clipping.
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/backend/cpu/adamw.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

// The parts of unit slice [slice_begin, slice_end) that belong to parameters with
// weight decay, relative to slice_begin. Alignment padding is never decayed (it is
// zero and has zero gradient, so it stays zero either way).
std::vector<ElementRange> weight_decay_ranges(const UnitLayout& unit, int64_t slice_begin,
                                              int64_t slice_end);

// torch.nn.utils.clip_grad_norm_'s multiplier: min(1, max_norm / (norm + 1e-6));
// max_norm <= 0 disables clipping.
float clip_multiplier(double global_norm, float max_norm);

}  // namespace shardlm
