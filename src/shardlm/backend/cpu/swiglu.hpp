// SwiGLU, the gated MLP activation of Llama and Qwen: h = silu(gate) * up, with
// silu(g) = g * sigmoid(g). gate and up come from one GEMM: gate_up [N, 2I] holds
// Hugging Face's gate_proj output in columns [0, I) and up_proj's in [I, 2I).
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// h [N, I] = silu(gate) * up, computed in fp32 from gate_up as stored (it may be in a
// compute type) and rounded once when stored in h's type.
void swiglu_forward(TypedPtr h, ConstTypedPtr gate_up, int64_t N, int I);

// The same from a GEMM's fp32 output gate_up_in, which is also stored rounded to
// gate_up_out's type (the backward's input; with fp32 it may be gate_up_in itself): h
// is computed from the rounded values, so the backward differentiates exactly what the
// forward used.
void swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float* gate_up_in, int64_t N, int I);

// dgate_up [N, 2I] (fp32, overwritten) from dh [N, I] and the stored gate_up:
// dgate = dh * up * sigmoid(g) (1 + g (1 - sigmoid(g))), dup = dh * silu(g).
// dgate_up must not alias dh or gate_up.
void swiglu_backward(float* dgate_up, const float* dh, ConstTypedPtr gate_up, int64_t N, int I);

}  // namespace shardlm::cpu
