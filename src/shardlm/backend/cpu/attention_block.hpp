// Ring attention's blocks (model/context_parallel/ring_attention.hpp): the queries a
// rank holds over the keys and values of one block of the same rows (its own or one
// that travelled the ring), each query seeing the keys [first, end) of the block that
// key_range gives it (the causal mask and packed documents' starts, worked out from the
// global positions by the caller). A block's result is the softmax over its own keys
// with their log-sum-exp; attention_lse_merge combines two blocks' results into the
// softmax over both, so the blocks of a row merged in any order give the attention
// over all of them. The backward takes the merged (final) output and log-sum-exp, so
// each block's probabilities are the final ones and the blocks' gradients add up.
//
// Layouts (row-major, hd = head_dim, KV = n_kv_head):
//   q          [B * q_len, ld_q]: query head h in columns [h hd, (h+1) hd) (a fused
//              q|k|v row, ld_q its width, works as it is)
//   kv         [B * kv_len, 2 KV hd]: the k heads, then the v heads
//   key_range  [B * q_len, 2] int32: query (b, i) sees keys [first, end) of row b's
//              block; 0 <= first, end <= kv_len; first >= end: none
//   out        [B * q_len, n_head hd] fp32;  lse [B, n_head, q_len] fp32
// A query that sees no key gets out = 0 and lse = -inf (a merge then keeps the other
// side). GQA as in attention.hpp: query head h reads kv head h / (n_head / KV).
//
// Arithmetic: fp32 on the stored (widened) values, tiled as attention.cpp's whole-row
// kernel (attention_tiles.hpp): 64 x 64 tiles of queries and keys, register-blocked tile
// products, exp by exp_approx (~2 ulp), the forward an online softmax over the key
// tiles a query tile sees. Scores scaled by 1/sqrt(hd) as in attention.cpp. A task
// owns a (batch row, query head) in the forward and a (batch row, kv head) in the
// backward, whose key gradients it sums over its group's query heads in head order,
// each over the query tiles in order: deterministic, independent of the thread count.
#pragma once

#include <cstdint>

#include "shardlm/backend/attention_block_shape.hpp"
#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

using ::shardlm::AttentionBlockShape;

void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q,
                             ConstTypedPtr kv, const AttentionBlockShape& s,
                             const int32_t* key_range);

// dq [B * q_len, n_head hd] and dkv [B * kv_len, 2 KV hd] (fp32) are ADDED to: the
// ring sums a block's key gradients over the ranks it visits. dout [B * q_len, n_head
// hd] fp32; out ([B * q_len, n_head hd], q's type) and lse are the merged forward's.
void attention_block_backward(float* dq, float* dkv, const float* dout, ConstTypedPtr out,
                              const float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                              const AttentionBlockShape& s, const int32_t* key_range);

// (out, lse) becomes the merge of itself and (block_out, block_lse): per query and head
// lse = log(e^lse + e^block_lse), out = out e^(old lse - lse) + block_out e^(block_lse - lse).
void attention_lse_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                         const AttentionBlockShape& s);

}  // namespace shardlm::cpu
