// UlyssesAttention (DeepSpeed-Ulysses): each rank of the context group holds T / P
// contiguous tokens of every row with all heads; an all-to-all turns them into all T
// tokens of H / P query heads, the local attention kernel runs on them unchanged
// (packed documents' key_begin as the full rows have it), and an all-to-all turns the
// output back. Backward mirrors the two exchanges around the kernel's backward.
//
// GQA: rank j takes query heads [j H/P, (j+1) H/P). With P dividing the KV heads it
// takes KV / P of them; with P a multiple of KV every rank takes the one KV head its
// query heads read, so each KV head is replicated on P / KV ranks and its gradient is
// the sum of theirs (added in rank order).
//
// Under hybrid attention (hybrid_attention.hpp) the group is one Ulysses group of a ring
// of `ring_size` of them: the rows it gathers are its ring rank's T / ring_size tokens,
// and the ring's block loop runs between the exchanges (gather_heads .. scatter_output,
// gather_output_gradient .. scatter_qkv_gradient) in place of the kernel.
#pragma once

#include <vector>

#include "shardlm/model/context_parallel/context_attention.hpp"

namespace shardlm {

class UlyssesAttention final : public ContextAttention {
 public:
  UlyssesAttention(Communicator& group, const ContextSplit& split, const ContextHeads& heads,
                   int seq_len, DType compute, int ring_size = 1);
  void carve(ArenaCarver& carver, int slots, int max_batch) override;
  void begin_micro_batch(Backend& backend) override;
  void forward(int slot, Backend& backend, ConstTypedPtr qkv, TypedPtr out, int B) override;
  void backward(int slot, Backend& backend, const float* dout, float* dqkv, int B) override;
  bool keeps_own_qkv() const override { return true; }

  // The heads this rank holds after the exchange.
  const ContextHeads& local_heads() const { return local_; }
  // The exchanges on their own. gather_heads: this rank's tokens' q|k|v (all heads) into
  // the slot's [B, gathered T, local q|k|v], which it returns; scatter_output: the slot's
  // output (saved_output, written by the caller) back to [B * local T, q_columns] of this
  // rank's tokens. gather_output_gradient: dout of this rank's tokens to the gathered
  // rows' [B, gathered T, local q columns] (fp32, returned); scatter_qkv_gradient: the
  // gathered rows' q|k|v gradient (qkv_gradient_rows, written by the caller) back.
  TypedPtr gather_heads(int slot, Backend& be, ConstTypedPtr qkv, int B);
  TypedPtr saved_output(int slot) const { return saved_.at(static_cast<size_t>(slot)).out; }
  void scatter_output(int slot, Backend& be, TypedPtr out, int B);
  float* gather_output_gradient(Backend& be, const float* dout, int B);
  float* qkv_gradient_rows() const { return dqkv_rows_; }
  void scatter_qkv_gradient(Backend& be, float* dqkv, int B);

 private:
  struct Saved {
    TypedPtr qkv;          // [B, T, local qkv columns]: this rank's heads, every token
    TypedPtr out;          // [B, T, local q columns]
    float* lse = nullptr;  // [B, H / P, T]
  };
  int first_kv_head(int rank) const;
  int gathered_len() const { return split_.full_len() / ring_size_; }
  AttentionShape local_shape(int B) const;
  // Block j of `packed` holds B x local T rows of rank j's tokens; `rows` the whole rows.
  // to_rows: each block into its place in the rows; else the rows into the blocks.
  void move_rows(Backend& be, TypedPtr rows, TypedPtr packed, int64_t width, int B, bool to_rows);

  Communicator& group_;
  const ContextSplit& split_;
  const ContextHeads heads_;   // the model's
  const ContextHeads local_;   // this rank's after the exchange
  const int P_, ring_size_, T_, Tl_;
  const bool replicated_kv_;   // P > KV heads
  const DType compute_;
  std::vector<Saved> saved_;
  float* send_ = nullptr;      // exchange buffers (fp32-sized; forward uses them in the compute type)
  float* recv_ = nullptr;
  float* drows_ = nullptr;     // [B, T, local q columns]: the output's gradient on whole rows
  float* dqkv_rows_ = nullptr; // [B, T, local qkv columns]
  float* kv_sum_ = nullptr;    // replicated KV: [B * local T, 2 head_dim] x 2
  float* kv_part_ = nullptr;
  int32_t* key_begin_ = nullptr;  // on a device: the full rows' key_begin
  const int32_t* key_begin_view_ = nullptr;
  int max_batch_ = 0;
};

}  // namespace shardlm
