// Causal multi-head self-attention on the fused qkv projection, flash-attention
// style: no [B, H, T, T] tensor. Scores are computed a key block at a time with an
// online softmax; the per-row log-sum-exp is kept so the backward recomputes the
// probabilities instead of storing them. The masked upper triangle is skipped.
//
// Layouts (row-major):
//   qkv  [B, T, 3C]: q = columns [0, C), k = [C, 2C), v = [2C, 3C); head h is the
//        columns [h*hd, (h+1)*hd) of each group (hd = C / H).
//   out  [B, T, C]: head h in columns [h*hd, (h+1)*hd), ready for the c_proj GEMM.
//   lse  [B, H, T]: log sum_{j<=i} exp(q_i . k_j / sqrt(hd)).
// Work is split over (batch, head) (and query blocks in the forward) with OpenMP;
// each task's scratch lives on its thread's stack.
//
// Mixed precision: qkv and out may be stored in a compute type (both in the same
// one). The kernels widen what they load to fp32 (exact) and compute in fp32, so they
// give the fp32 kernels' result on the stored (rounded) values; out is rounded once
// when stored. lse, dout and dqkv are fp32.
#pragma once

#include <cstdint>

#include "shardlm/backend/cpu/dtype.hpp"

namespace shardlm::cpu {

inline constexpr int kAttentionMaxHeadDim = 128;

void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, int B, int T, int C, int H);

// dqkv [B, T, 3C] is overwritten with the gradient of q, k and v.
void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                        const float* lse, int B, int T, int C, int H);

}  // namespace shardlm::cpu
