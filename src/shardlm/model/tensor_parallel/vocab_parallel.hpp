// Vocabulary-parallel token embedding and fused LM head + cross-entropy (the arithmetic
// of Megatron-core's VocabParallelEmbedding and vocab_parallel_cross_entropy) over the
// tensor group of a TensorParallelBlock. Tensor rank t holds rows
// [t Vp / T, (t + 1) Vp / T) of the padded vocabulary Vp (tensor_layout.hpp); the rows
// at or past the real vocabulary V are padding and never take part.
//
//   lookup:  each rank writes the rows of the tokens it holds and zeros for the others;
//            the sum over the group (one all-reduce) is every row, exactly (x + 0 + ...)
//   head:    per chunk of token rows, the local logits [rows, Vp / T] only; the row
//            maxima (all-reduce max), then the sums of e^(logit - max) and the target's
//            logit (one all-reduce of both) give each row's loss
//            max + log(sum) - target logit on every rank; the gradient's local
//            columns softmax - onehot feed the two local GEMMs: the weight's rows here,
//            and a partial input gradient, summed over the group after the last chunk.
//            No rank ever holds a [tokens x V] logits tensor.
//
// The per-row work between the GEMMs and the collectives is the backend's
// (backend/cpu/vocab_shard.hpp: vocab_shard_*), so it runs on every backend: the host,
// a device (tokens and targets: the model's device copies) and the meta backend, which
// records it. The host reads only the host copy of the targets (to skip a chunk that
// has none) and, for generation, the gathered logits.
#pragma once

#include <cstdint>

#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/model/model_support.hpp"
#include "shardlm/model/tensor_parallel/tensor_parallel_block.hpp"
#include "shardlm/model/tensor_parallel/tensor_piece.hpp"

namespace shardlm {

class Backend;

// The vocabulary rows one tensor rank holds.
struct VocabShard {
  int64_t begin = 0;  // first row held
  int rows = 0;       // rows held (padded vocabulary / T)
  int real = 0;       // of them inside the real vocabulary (a prefix; 0 on a padding-only rank)
  int vocab = 0;      // the real vocabulary, over all ranks
  static VocabShard of(int vocab_size, int padded_vocab, TensorSplit split);
  VocabShardRows held() const { return {begin, real}; }
};

class VocabParallelEmbedding {
 public:
  void carve(ArenaCarver& carver, int64_t n, VocabShard shard);
  // tokens: on the backend's device.
  // out [B T, C] fp32 = the rows of `tokens` in the table (this rank's rows, compute type
  // value_type), summed over the group. With scatter_to (sequence parallelism) the sum's
  // block of this rank's tokens goes there instead ([B T / size, C]; out is scratch).
  void forward(Backend& backend, const TensorParallelBlock& tp, float* out, const int32_t* tokens,
               ConstTypedPtr table, int B, int T, int C, DType value_type,
               float* scatter_to = nullptr);
  // dtable (this rank's rows) += dout's rows of the tokens it holds. dout's other rows
  // are zeroed (the caller's dout is not needed after the lookup's backward).
  void backward(Backend& backend, float* dtable, float* dout, const int32_t* tokens, int B, int T,
                int C);

 private:
  VocabShard shard_;
  // [n] the tokens as rows of this rank's table (0 for those held elsewhere, then masked)
  int32_t* local_tokens_ = nullptr;
};

class VocabParallelHead {
 public:
  // The same chunk rows as the unsplit head (LmHead::chunk_rows_for of the whole padded
  // vocabulary), so the logits chunk is 1 / T of the unsplit one.
  void carve(ArenaCarver& carver, int64_t n, VocabShard shard, int padded_vocab, int C,
             DType compute);
  int chunk_rows() const { return chunk_rows_; }
  // LmHead::loss over the group: weight is this rank's rows, dweight (+=) their gradient
  // (null: frozen), dx (overwritten) the whole input gradient, the same on every rank;
  // with scatter_dx (sequence parallelism) only its block of this rank's n / size rows,
  // at dx + rank * n / size * C (the other rows are scratch). targets: on the device;
  // host_targets: the same in host memory.
  double loss(Backend& backend, const TensorParallelBlock& tp, ConstTypedPtr x,
              ConstTypedPtr weight, const int32_t* targets, const int32_t* host_targets,
              int64_t n, float grad_scale, float* dx, float* dweight,
              bool scatter_dx = false) const;
  // logits [rows, V] (host memory) of `rows` hidden states at stride ld: the local
  // columns gathered from the group (in a scratch of the backend's memory).
  void logits(Backend& backend, const TensorParallelBlock& tp, ConstTypedPtr x, int64_t ld,
              int rows, ConstTypedPtr weight, float* out) const;

 private:
  VocabShard shard_;
  int C_ = 0, chunk_rows_ = 0;
  float* logits_chunk_ = nullptr;  // [chunk_rows, shard rows]
  float* row_max_ = nullptr;       // [chunk_rows]
  float* row_sums_ = nullptr;      // [chunk_rows, 2]: sum of e^(l - max), target logit
  float* row_loss_ = nullptr;      // [n]
  TypedPtr dlogits_c_;             // [chunk_rows, shard rows] in the compute type (not fp32)
};

}  // namespace shardlm
