// Token + learned position embedding (GPT-2's first unit).
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. out is [B*T, C].
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C);

// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:].
// Each thread owns a block of columns, so the scatter-add needs no atomics and the
// result does not depend on the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

}  // namespace shardlm::cpu
