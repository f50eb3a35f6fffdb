// RingAttention (ring attention with the zigzag split, as zhuzilin/ring-flash-attention
// and Megatron's context parallelism run it): each rank of the context group holds the
// chunks r and 2P-1-r of every row (ContextSplit with zigzag) with all heads. Its
// queries stay; the keys and values travel: in P steps each rank computes its queries
// over one block of k|v (its own first, then the one its ring predecessor held, ...)
// while the next block arrives by one send_recv (to rank r+1, from r-1), and merges the
// blocks' results by their log-sum-exp. Which keys a query sees follows from the global
// positions (causal) and, for packed rows, the full rows' key_begin; under the zigzag
// split every rank's blocks then hold the same share of the causal mask's pairs.
//
// Backward: the k|v blocks travel the same way; each block's k|v gradient travels with
// it, each rank adding its queries' share, and after P steps is back at the block's own
// rank (P send_recvs of the gradient, P - 1 of k|v). The probabilities are the final
// ones (the merged log-sum-exp), so the shares add up to the gradient over whole rows.
//
// Under hybrid attention (hybrid_attention.hpp) the group is the ring across Ulysses
// groups: its rank g's queries are the tokens of zigzag group g (split's chunks), with the
// heads of the Ulysses rank (`heads` as the exchange left them).
//
// Heads are not split, so any head count works. Messages are k|v in the compute type
// (2 KV hd values per token) and their gradient in fp32.
#pragma once

#include <vector>

#include "shardlm/model/context_parallel/context_attention.hpp"

namespace shardlm {

class RingAttention final : public ContextAttention {
 public:
  RingAttention(Communicator& group, const ContextSplit& split, const ContextHeads& heads,
                int seq_len, DType compute);
  void carve(ArenaCarver& carver, int slots, int max_batch) override;
  void begin_micro_batch(Backend& backend) override;
  void forward(int slot, Backend& backend, ConstTypedPtr qkv, TypedPtr out, int B) override;
  void backward(int slot, Backend& backend, const float* dout, float* dqkv, int B) override;
  bool keeps_own_qkv() const override { return false; }  // Saved points at the model's

 private:
  struct Saved {
    // The model's q|k|v and attention output of the layer (its activations, kept until
    // the layer's backward, or recomputed before it with activation checkpointing).
    ConstTypedPtr qkv;
    ConstTypedPtr out;
    float* lse = nullptr;  // [B, H, local T]: over every block merged
  };
  AttentionBlockShape block_shape(int B) const;
  // Which keys of rank `source`'s block this rank's queries see: [B * local T, 2].
  const int32_t* key_range(int source) const;
  int next() const { return (rank_ + 1) % P_; }
  int previous() const { return (rank_ + P_ - 1) % P_; }

  Communicator& group_;
  const ContextSplit& split_;  // the model's: the micro-batch's whole rows
  const ContextSplit ring_;    // this ring rank's tokens of a row (zigzag over the ring)
  const ContextHeads heads_;
  const int P_, rank_, T_;
  const DType compute_;
  std::vector<Saved> saved_;
  TypedPtr kv_[2];               // [B * local T, 2 KV hd]: the block at hand and the next
  float* dkv_[2] = {nullptr, nullptr};  // their gradients (fp32)
  float* out_ = nullptr;         // [B * local T, H hd]: the merged output (fp32)
  float* block_out_ = nullptr;   // one block's
  float* block_lse_ = nullptr;   // [B, H, local T]
  float* dq_ = nullptr;          // [B * local T, H hd]
  std::vector<int32_t> ranges_;  // per source rank, [B * local T, 2] (host)
  int32_t* ranges_device_ = nullptr;
  const int32_t* ranges_view_ = nullptr;  // where the kernels read them
  int max_batch_ = 0;
};

}  // namespace shardlm
