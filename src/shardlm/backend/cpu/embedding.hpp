// Token embedding, plus a learned position embedding where the model has one (GPT-2's
// first unit; Llama and Qwen have none: their positions enter through RoPE).
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos(b,t),:], summed in fp32. out is [B*T, C].
// pos(b,t) = positions[b*T + t] (packed sequences: restarting per document; each must
// be below the table's rows, which the caller checks), or t when positions is null.
// With wpe.data null there is no position table: out[b,t,:] = wte[tokens[b,t],:].
// The tables may be fp32 or a compute type; each value is first rounded to
// value_type (a no-op for tables already stored in it), so fp32 tables read with
// value_type = bf16 give bitwise the result of bf16-stored tables.
void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte, ConstTypedPtr wpe,
                       int B, int T, int C, DType value_type = DType::fp32,
                       const int32_t* positions = nullptr);

// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[pos(b,t),:] += dout[b,t,:] (dwpe null: no
// position table, nothing to accumulate), pos as in the forward.
// Each thread owns a block of columns, so the scatter-add needs no atomics and the
// result does not depend on the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C, const int32_t* positions = nullptr);

}  // namespace shardlm::cpu
