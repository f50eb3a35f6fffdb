// AdamW on flat fp32 slices (the rank's owned state), with decoupled weight decay
// applied only where a parameter asks for it (2-D weights), as PyTorch's AdamW.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// A half-open element range [begin, end) relative to the start of a slice.
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The parts of unit slice [slice_begin, slice_end) that belong to parameters with
// weight decay, relative to slice_begin. Alignment padding is never decayed (it is
// zero and has zero gradient, so it stays zero either way).
std::vector<ElementRange> weight_decay_ranges(const UnitLayout& unit, int64_t slice_begin,
                                              int64_t slice_end);

// One AdamW step (1-based `step`) over n elements. `grad_multiplier` scales the
// gradient first (gradient clipping, loss-scale removal). Matches torch.optim.AdamW:
//   p *= 1 - lr * wd (decayed ranges only); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// With rounded_params set, also writes the updated p converted to its type (the
// compute-type copy the model reads), block by block while p is still in cache:
// bitwise cpu::convert's result, without a second pass over p.
void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                  int64_t step, const AdamWConfig& config,
                  TypedPtr rounded_params = TypedPtr());

// Sum of squares of a gradient slice, accumulated in double (for the global norm).
double sum_of_squares(const float* data, int64_t n);

// torch.nn.utils.clip_grad_norm_'s multiplier: min(1, max_norm / (norm + 1e-6));
// max_norm <= 0 disables clipping.
float clip_multiplier(double global_norm, float max_norm);

}  // namespace shardlm
