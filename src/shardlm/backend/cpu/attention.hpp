// Causal self-attention on the fused qkv projection, flash-attention style: no
// [B, H, T, T] tensor. Scores are computed a key block at a time with an online
// softmax; the per-row log-sum-exp is kept so the backward recomputes the
// probabilities instead of storing them. The masked upper triangle is skipped.
//
// Grouped-query attention (GQA): n_head query heads share n_kv_head key/value heads,
// query head h reading kv head h / (n_head / n_kv_head); n_kv_head == n_head is
// multi-head attention (GPT-2). Packed documents: with key_begin, each query sees only
// the keys of its own document.
//
// Layouts (row-major, hd = head_dim):
//   qkv  [B*T, (n_head + 2 n_kv_head) hd]: the q heads, then the k heads, then the v
//        heads, each head's hd values contiguous. (GPT-2's c_attn output, C = n_head hd,
//        is this with n_kv_head = n_head: q = [0, C), k = [C, 2C), v = [2C, 3C).)
//   out  [B*T, n_head hd]: head h in columns [h hd, (h+1) hd), ready for the o_proj GEMM.
//   lse  [B, n_head, T]: log sum_{visible j} exp(q_i . k_j / sqrt(hd)).
// Work is split over (batch, query head) with OpenMP; each task builds its head's
// operands once (fp32 rows, transposed key blocks) in a per-thread scratch that grows
// to the largest head once, and its tiles live on the thread's stack.
//
// Mixed precision: qkv and out may be stored in a compute type (both in the same
// one); lse, dout and dqkv are fp32. fp16 (and bf16 where the bf16 dot products do
// not run) widens what it loads to fp32 (exact) and computes in fp32, so it gives the
// fp32 kernels' result on the stored (rounded) values, out rounded once when stored.
// bf16 with avx512_bf16, for multi-head attention without key_begin and an even
// head_dim (GPT-2's case), runs its products as bf16 dot products with fp32
// accumulation (attention_bf16.hpp), like bf16 flash attention: the probabilities,
// the score gradients and dout are rounded to bf16 before the products that read
// them. GQA and packed documents take the widening path on every CPU (the dot-product
// kernels handle neither; see use_bf16_dot_products in attention.cpp).
#pragma once

#include "shardlm/backend/kernel_args.hpp"

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

using ::shardlm::AttentionShape;
using ::shardlm::kAttentionMaxHeadDim;

// out = softmax(q k^T / sqrt(hd), causal [, documents]) v per query head; lse kept for
// the backward. key_begin: null, or [B*T] int32 where query position t of batch row
// b sees the keys [key_begin[b*T + t], t] (the start of t's document when sequences
// are packed; 0 <= key_begin <= t, else Error). Causal always.
void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, const AttentionShape& s,
                       const int32_t* key_begin = nullptr);

// dqkv [B*T, (n_head + 2 n_kv_head) hd] is overwritten with the gradient of q, k and
// v. A kv head's gradient sums its group's query heads in head order (deterministic,
// independent of the thread count). key_begin as in the forward.
void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                        const float* lse, const AttentionShape& s,
                        const int32_t* key_begin = nullptr);

// A KV cache's step: attention of s.T new queries of one sequence (s.B == 1) at
// positions [past, past + s.T) over the keys and values of positions [0, past + s.T)
// (the cache, which already holds the new ones). q [s.T, ld_q] holds the query heads
// (the first n_head hd columns of a qkv row), k and v [past + s.T, ld_kv] the kv heads,
// out [s.T, n_head hd]. Each query gets bitwise what attention_forward gives its
// position over the whole sequence on the widening path (same key blocks, same order;
// the bf16 dot-product kernels are not used here).
void attention_forward_cached(TypedPtr out, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr k,
                              ConstTypedPtr v, int64_t ld_kv, const AttentionShape& s, int past);

// How bf16 attention runs. kAuto: bf16 dot products where attention_uses_bf16_dot_products,
// else kWidenToFp32. A forward and its backward must run the same path (the backward
// recomputes the forward's scores). Tests force each path; kBf16DotProducts where
// they cannot run (no avx512_bf16, odd head_dim, GQA, key_begin) is an Error.
enum class Bf16AttentionPath { kAuto, kWidenToFp32, kBf16DotProducts };

void attention_forward_on(Bf16AttentionPath path, TypedPtr out, float* lse, ConstTypedPtr qkv,
                          const AttentionShape& s, const int32_t* key_begin = nullptr);
void attention_backward_on(Bf16AttentionPath path, float* dqkv, const float* dout,
                           ConstTypedPtr qkv, ConstTypedPtr out, const float* lse,
                           const AttentionShape& s, const int32_t* key_begin = nullptr);

// Whether kAuto runs bf16 attention of this shape on bf16 dot products on this CPU:
// avx512_bf16, even head_dim, n_kv_head == n_head and no key_begin.
bool attention_uses_bf16_dot_products(const AttentionShape& s, bool has_key_begin = false);

}  // namespace shardlm::cpu
