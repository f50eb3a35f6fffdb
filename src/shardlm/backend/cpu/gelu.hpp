// GELU, tanh approximation (GPT-2): gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include <cstdint>

#include "shardlm/backend/cpu/dtype.hpp"

namespace shardlm::cpu {

// pre += bias (per column) in place, then out = gelu(pre): the MLP's c_fc bias and
// activation in one pass. pre keeps the biased pre-activation for the backward.
// pre and out are [N, M]; bias is [M] (may be null). out may be in a compute type
// (GELU runs in fp32; the result is rounded once when stored).
void bias_gelu_forward(TypedPtr out, float* pre, const float* bias, int64_t N, int M);

// dinp = dout * gelu'(pre), elementwise over count values; dinp may alias dout.
void gelu_backward(float* dinp, const float* dout, const float* pre, int64_t count);

}  // namespace shardlm::cpu
