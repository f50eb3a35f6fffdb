// The per-row work of the vocabulary-parallel embedding and fused LM head + loss
// (model/tensor_parallel/vocab_parallel.hpp), between the GEMMs and the collectives
// over the tensor group. `shard` holds the rows [begin, begin + real); a token or
// target t is held here when begin <= t < begin + real. logits are a chunk's local
// logits [rows, ld], of which the first shard.real columns are read or written.
//
//   lookup:  vocab_shard_localize, embedding_forward, vocab_shard_mask_rows, sum
//   loss:    gemm, vocab_shard_row_max, max over the group, vocab_shard_softmax_sums,
//            sum over the group, vocab_shard_loss; with gradients
//            vocab_shard_softmax_backward, then the two backward GEMMs
#pragma once

#include <cstdint>

#include "shardlm/backend/kernel_args.hpp"

namespace shardlm::cpu {

// local_tokens[i] = tokens[i] - begin where held, else 0 (a row of this rank's table
// that vocab_shard_mask_rows zeroes afterwards).
void vocab_shard_localize(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                          VocabShardRows shard);
// rows [n, C]: row i zeroed where tokens[i] is not held (the others untouched).
void vocab_shard_mask_rows(float* rows, const int32_t* tokens, int64_t n, int C,
                           VocabShardRows shard);
// row_max[r] = the largest of the row's shard.real logits (-inf when real == 0).
void vocab_shard_row_max(float* row_max, const float* logits, int64_t ld, int rows,
                         VocabShardRows shard);
// With row_max the maximum over the group: sums[2 r + 1] = the target's logit where
// targets[r] >= 0 is held, else 0; then the row is OVERWRITTEN with its softmax
// numerators e^(l - row_max[r]) (exp_approx) and sums[2 r] = their sum, in column order.
void vocab_shard_softmax_sums(float* sums, float* logits, int64_t ld, const float* row_max,
                              const int32_t* targets, int rows, VocabShardRows shard);
// With sums summed over the group: losses[r] = row_max[r] + log(sums[2 r]) - sums[2 r + 1],
// 0 where targets[r] < 0.
void vocab_shard_loss(float* losses, const float* row_max, const float* sums,
                      const int32_t* targets, int rows);
// The numerators (vocab_shard_softmax_sums) OVERWRITTEN with the loss gradient's local
// columns grad_scale * (softmax - onehot): e * (grad_scale / sums[2 r]), minus
// grad_scale at a held target; zeros where targets[r] < 0.
void vocab_shard_softmax_backward(float* logits, int64_t ld, const float* sums,
                                  const int32_t* targets, int rows, float grad_scale,
                                  VocabShardRows shard);

}  // namespace shardlm::cpu
