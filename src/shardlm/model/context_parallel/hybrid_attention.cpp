#include "shardlm/model/context_parallel/hybrid_attention.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

// A sub-group of the context group whose traffic the context group's counters include
// (the trainer reads the mesh groups' counters for a step's bytes, which plan predicts).
std::unique_ptr<Communicator> sub_group(Communicator& group, int color, const std::string& suffix) {
  std::unique_ptr<Communicator> sub = group.split(color, group.rank(), group.name() + suffix);
  group.count_with_parent(*sub);
  return sub;
}

std::unique_ptr<Communicator> ulysses_group(Communicator& group, int U) {
  SHARDLM_CHECK(U > 1 && group.size() % U == 0 && U < group.size(),
                "internal: hybrid attention with Ulysses groups of {} in {} ranks", U, group.size());
  return sub_group(group, group.rank() / U, ".ulysses");
}

}  // namespace

HybridAttention::HybridAttention(Communicator& group, int U, const ContextSplit& split,
                                 const ContextHeads& heads, int seq_len, DType compute)
    : ulysses_group_(ulysses_group(group, U)),
      ring_group_(sub_group(group, group.rank() % U, ".ring")),
      ulysses_(*ulysses_group_, split, heads, seq_len, compute, group.size() / U),
      ring_(*ring_group_, split, ulysses_.local_heads(), seq_len, compute) {}

void HybridAttention::carve(ArenaCarver& carver, int slots, int max_batch) {
  ulysses_.carve(carver, slots, max_batch);
  ring_.carve(carver, slots, max_batch);
}

void HybridAttention::begin_micro_batch(Backend& backend) {
  ulysses_.begin_micro_batch(backend);
  ring_.begin_micro_batch(backend);
}

void HybridAttention::forward(int slot, Backend& be, ConstTypedPtr qkv, TypedPtr out, int B) {
  const TypedPtr rows = ulysses_.gather_heads(slot, be, qkv, B);
  ring_.forward(slot, be, rows, ulysses_.saved_output(slot), B);
  ulysses_.scatter_output(slot, be, out, B);
}

void HybridAttention::backward(int slot, Backend& be, const float* dout, float* dqkv, int B) {
  const float* drows = ulysses_.gather_output_gradient(be, dout, B);
  ring_.backward(slot, be, drows, ulysses_.qkv_gradient_rows(), B);
  ulysses_.scatter_qkv_gradient(be, dqkv, B);
}

}  // namespace shardlm
