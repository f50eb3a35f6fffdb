// HybridAttention (USP, as feifeibear/long-context-attention combines the two): the
// context group of P ranks is P / U Ulysses groups of U consecutive ranks. A row is split
// zigzag over the groups (group g holds chunks g and 2P/U - 1 - g of 2P/U), and each rank
// of a group a contiguous U-th of its group's tokens (ContextSplit with ulysses_degree).
// Ulysses' all-to-all inside the group turns [T/P tokens, all heads] into [the group's
// T U/P tokens, H/U heads]; ring attention across the groups (the ranks of the same
// Ulysses index, one per group) runs over those tokens and heads, its causal key ranges
// exact because the group's tokens are the ring's zigzag chunks; Ulysses' second
// all-to-all returns the output. Backward mirrors it: the output gradient's exchange, the
// ring's backward, the q|k|v gradient's exchange.
#pragma once

#include <memory>

#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/model/context_parallel/ring_attention.hpp"
#include "shardlm/model/context_parallel/ulysses_attention.hpp"

namespace shardlm {

class HybridAttention final : public ContextAttention {
 public:
  // `group`: the whole context group (its ranks split into the two sub-groups here, a
  // collective over the group); `split`: ContextSplit(rank, P, zigzag, ulysses_degree).
  HybridAttention(Communicator& group, int ulysses_degree, const ContextSplit& split,
                  const ContextHeads& heads, int seq_len, DType compute);
  void carve(ArenaCarver& carver, int slots, int max_batch) override;
  void begin_micro_batch(Backend& backend) override;
  void forward(int slot, Backend& backend, ConstTypedPtr qkv, TypedPtr out, int B) override;
  void backward(int slot, Backend& backend, const float* dout, float* dqkv, int B) override;
  bool keeps_own_qkv() const override { return true; }  // the ring reads Ulysses' rows

 private:
  std::unique_ptr<Communicator> ulysses_group_, ring_group_;
  UlyssesAttention ulysses_;
  RingAttention ring_;
};

}  // namespace shardlm
