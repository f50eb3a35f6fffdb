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
// Work is split over (batch, head) with OpenMP; each task builds its head's operands
// once (fp32 rows, transposed key blocks) in a per-thread scratch that grows to the
// largest head once, and its tiles live on the thread's stack.
//
// Mixed precision: qkv and out may be stored in a compute type (both in the same
// one); lse, dout and dqkv are fp32. fp16 (and bf16 on a CPU without avx512_bf16)
// widens what it loads to fp32 (exact) and computes in fp32, so it gives the fp32
// kernels' result on the stored (rounded) values, out rounded once when stored. bf16
// where the CPU has avx512_bf16 runs its products as bf16 dot products with fp32
// accumulation (attention_bf16.hpp), like bf16 flash attention: the probabilities,
// the score gradients and dout are rounded to bf16 before the products that read them.
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

inline constexpr int kAttentionMaxHeadDim = 128;

void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, int B, int T, int C, int H);

// dqkv [B, T, 3C] is overwritten with the gradient of q, k and v.
void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                        const float* lse, int B, int T, int C, int H);

// How bf16 attention runs. kAuto: bf16 dot products where the CPU has avx512_bf16 and
// head_dim is even, else kWidenToFp32. A forward and its backward must run the same
// path (the backward recomputes the forward's scores). Tests force each path;
// kBf16DotProducts on a CPU without avx512_bf16 (or an odd head_dim) is an Error.
enum class Bf16AttentionPath { kAuto, kWidenToFp32, kBf16DotProducts };

void attention_forward_on(Bf16AttentionPath path, TypedPtr out, float* lse, ConstTypedPtr qkv,
                          int B, int T, int C, int H);
void attention_backward_on(Bf16AttentionPath path, float* dqkv, const float* dout,
                           ConstTypedPtr qkv, ConstTypedPtr out, const float* lse, int B, int T,
                           int C, int H);
// Whether kAuto runs bf16 dot products for this head_dim on this CPU.
bool attention_uses_bf16_dot_products(int head_dim);

}  // namespace shardlm::cpu
