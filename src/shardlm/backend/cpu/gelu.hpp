// GELU, tanh approximation (GPT-2): gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// x = pre_in + bias (per column); pre_out = x and out = gelu(x): the MLP's c_fc bias
// and activation in one pass, keeping the biased pre-activation for the backward.
// pre_out and out may be in a compute type; then x is rounded to pre_out's type
// first and GELU runs (in fp32) on the rounded value, so the backward's gelu'(pre)
// is the derivative at exactly the input the forward used. pre_in may be
// pre_out.data (in place, fp32). All are [N, M]; bias is [M] (may be null).
void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in, const float* bias,
                       int64_t N, int M);

// dinp = dout * gelu'(pre), elementwise over count values; dinp may alias dout; pre
// may be in a compute type.
void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre, int64_t count);

}  // namespace shardlm::cpu
