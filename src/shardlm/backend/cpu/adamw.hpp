// The CPU AdamW kernel on flat fp32 slices (the rank's owned state) and the sum of
// squares the global gradient norm is made of: the CPU backend's adamw_update and
// sum_of_squares (backend.hpp), which the CUDA kernels match bitwise. Which elements
// decay and the clipping multiplier are the optimizer's (optim/adamw.hpp).
#pragma once

#include <cstdint>
#include <span>

#include "shardlm/backend/adamw_config.hpp"
#include "shardlm/core/dtype.hpp"

namespace shardlm {

// One AdamW step (1-based `step`) over n elements. `grad_multiplier` scales the
// gradient first (gradient clipping, loss-scale removal). Matches torch.optim.AdamW:
//   p *= 1 - lr * wd (decayed ranges only); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// decay_ranges: sorted, disjoint, relative to params. With rounded_params set, also
// writes the updated p converted to its type (the compute-type copy the model reads),
// block by block while p is still in cache: bitwise cpu::convert's result, without a
// second pass over p.
void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                  int64_t step, const AdamWConfig& config,
                  TypedPtr rounded_params = TypedPtr());

// Sum of squares of a gradient slice, accumulated in double (for the global norm).
double sum_of_squares(const float* data, int64_t n);

}  // namespace shardlm
