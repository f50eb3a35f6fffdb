// ContextAttention: causal attention over sequences split across a context group
// (context_split.hpp), in place of the model's local attention kernel call. A model
// holds one when its ModelParallelGroups::context has more than one rank; it keeps the
// projections, norms and MLP on its own tokens and hands the attention its rows of q|k|v.
//
// The kinds (docs/parallelism.md "Context parallelism"):
//   ulysses  all-to-all q|k|v to [T tokens, H/P heads], the usual kernel, all-to-all back
//            (DeepSpeed-Ulysses); backward mirrors it.
//   ring     the zigzag split; queries stay, k|v blocks travel the ring (P - 1 send_recvs),
//            block results merged by their log-sum-exp (ring_attention.hpp).
//   hybrid   Ulysses inside groups of U consecutive ranks, ring across the P / U groups
//            (USP; hybrid_attention.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/context_parallel/context_split.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/model/model_support.hpp"

namespace shardlm {

// The attention heads of a layer as the model computes them.
struct ContextHeads {
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  int64_t q_columns() const { return static_cast<int64_t>(n_head) * head_dim; }
  int64_t kv_columns() const { return static_cast<int64_t>(n_kv_head) * head_dim; }
  int64_t qkv_columns() const { return q_columns() + 2 * kv_columns(); }
};

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  // Arrays for `slots` layers' saved attention state (one with activation
  // checkpointing) and the exchange's scratch, for up to max_batch rows.
  virtual void carve(ArenaCarver& carver, int slots, int max_batch) = 0;
  // After the micro-batch was sliced (ContextSplit::slice): makes the full rows'
  // key_begin readable where the kernels run.
  virtual void begin_micro_batch(Backend& backend) = 0;
  // qkv: this rank's tokens' q|k|v after RoPE, [B * local T, qkv_columns] (compute
  // type); out: their attention output, [B * local T, q_columns]. The layer's state is
  // kept in `slot` for backward.
  virtual void forward(int slot, Backend& backend, ConstTypedPtr qkv, TypedPtr out, int B) = 0;
  // dout: the gradient at this rank's attention output [B * local T, q_columns]; dqkv
  // (written): at its q|k|v [B * local T, qkv_columns].
  virtual void backward(int slot, Backend& backend, const float* dout, float* dqkv, int B) = 0;
  // Whether backward reads only what the attention saved itself (Ulysses and hybrid keep
  // the exchanged whole-row q|k|v and output of their heads), so the model's q|k|v of
  // this rank's tokens is read only by the layer's forward and one array serves every
  // layer. The ring keeps pointers to the model's q|k|v and output instead.
  virtual bool keeps_own_qkv() const = 0;
};

// "ulysses", "ring" or "hybrid" (--context-parallel-kind); Error naming the flag otherwise.
ContextParallelKind parse_context_parallel_kind(const std::string& name);
const char* context_parallel_kind_name(ContextParallelKind kind);
// Whether the kind's split is the zigzag one (ContextSplit; hybrid's over its Ulysses groups).
inline bool zigzag_split(ContextParallelKind kind) { return kind != ContextParallelKind::ulysses; }
// The Ulysses groups' size of a kind's split: --ulysses-degree for hybrid, else 1.
inline int split_ulysses_degree(ContextParallelKind kind, int ulysses_degree) {
  return kind == ContextParallelKind::hybrid ? ulysses_degree : 1;
}
// One-line errors unless --ulysses-degree U fits --context-parallel P of `kind`: U > 1
// only with hybrid, where it must divide P and be less than it.
void check_ulysses_degree(int P, ContextParallelKind kind, int ulysses_degree);
// One-line errors when `heads` cannot be split over P ranks as Ulysses needs (ring
// attention keeps every head on every rank).
void check_context_heads(int P, const ContextHeads& heads);
// One-line errors when a model of `config` cannot split its sequences over P ranks (its
// family, or its heads for the kind: under --tensor-parallel T a tensor rank's n_head / T
// and local key/value heads; hybrid's at its Ulysses degree): what `train` and `sft`
// check before writing anything.
void check_context_parallel_model(const ModelConfig& config, int P, ContextParallelKind kind,
                                  int tensor_size = 1, int ulysses_degree = 1);
// The model's context attention of `kind` over `group` (size > 1) for rows of
// `seq_len` tokens; `split` must be the kind's (zigzag_split, split_ulysses_degree).
std::unique_ptr<ContextAttention> make_context_attention(ContextParallelKind kind,
                                                         int ulysses_degree,
                                                         Communicator& group,
                                                         const ContextSplit& split,
                                                         const ContextHeads& heads, int seq_len,
                                                         DType compute);

}  // namespace shardlm
