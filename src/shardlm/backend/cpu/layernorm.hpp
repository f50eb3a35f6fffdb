// LayerNorm over the last dimension (GPT-2: eps 1e-5), plain and fused with the
// residual add that precedes it.
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

// out = (inp - mean) * rstd * weight + bias, row by row; mean and rstd [N] are kept
// for the backward. inp and out are [N, C]. out may be in a compute type: the
// statistics and arithmetic are fp32 and the result is rounded once when stored.
void layernorm_forward(TypedPtr out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int C);

// residual = a + branch + branch_bias (branch_bias may be null), then
// out = layernorm(residual): the residual stream is read once for both.
void residual_layernorm_forward(float* residual, TypedPtr out, float* mean, float* rstd,
                                const float* a, const float* branch, const float* branch_bias,
                                const float* weight, const float* bias, int64_t N, int C);

// Gradients ACCUMULATE: dinp += d/dinp, dweight += ..., dbias += ... . Parameter
// gradients are reduced over rows per column block in double, so they do not depend
// on the thread count. dinp must not alias dout or inp.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int C);

}  // namespace shardlm::cpu
