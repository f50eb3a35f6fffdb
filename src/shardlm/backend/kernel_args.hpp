// The argument records that kernels share across backends (backend.hpp) and that
// the cpu:: kernels take: shapes of attention and RMSNorm, the LM head's arguments, a
// view of the rotary tables, a tensor rank's vocabulary rows.
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm {

// Rotary tables on the backend's device: cos and sin [max_positions, head_dim / 2].
struct RopeTableView {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int head_dim = 0;
  int max_positions = 0;
};

// The shape of causal self-attention on a fused qkv row (backend/cpu/attention.hpp).
struct AttentionShape {
  int B = 0, T = 0;
  int n_head = 0;     // query heads
  int n_kv_head = 0;  // key/value heads: n_head % n_kv_head == 0; == n_head for MHA
  int head_dim = 0;   // 1 .. kAttentionMaxHeadDim
  int group_size() const { return n_head / n_kv_head; }  // query heads per kv head
  int64_t qkv_columns() const { return static_cast<int64_t>(n_head + 2 * n_kv_head) * head_dim; }
  int64_t out_columns() const { return static_cast<int64_t>(n_head) * head_dim; }
};
inline constexpr int kAttentionMaxHeadDim = 128;

// The vectors an RMSNorm normalizes (backend/cpu/rmsnorm.hpp).
struct RmsNormShape {
  int64_t rows = 0;
  int heads = 1;
  int dim = 0;
};

// The fused LM head + cross-entropy over row chunks (backend/cpu/lm_head_loss.hpp).
struct LmHeadLossArgs {
  ConstTypedPtr x;                   // [N, C] final hidden states (after the final norm)
  ConstTypedPtr weight;              // [>= V, C] head weight
  const int32_t* targets = nullptr;  // [N] on the device; a negative target is ignored
  int64_t N = 0;
  int C = 0;
  int V = 0;                         // real vocabulary size
  float grad_scale = 1.0f;
  float* logits_scratch = nullptr;   // [chunk_rows, logits_stride]
  TypedPtr dlogits_scratch;          // [chunk_rows, logits_stride] in x's type when not fp32
  int64_t logits_stride = 0;         // >= V
  int chunk_rows = 0;
};

// The vocabulary rows [begin, begin + real) one tensor rank holds (the real ones of its
// block of the padded vocabulary; model/tensor_parallel/vocab_parallel.hpp): the
// vocabulary-parallel embedding's and loss's kernels (backend/cpu/vocab_shard.hpp).
struct VocabShardRows {
  int64_t begin = 0;
  int real = 0;
};

}  // namespace shardlm
