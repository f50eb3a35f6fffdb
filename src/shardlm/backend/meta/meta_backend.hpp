// The meta device: a backend whose buffers have sizes but no storage and whose
// kernels record the FLOPs and bytes they would move instead of computing (PyTorch's
// meta device and fake tensors plan memory the same way). `plan` runs the real step on
// it (plan/traced_step.hpp): every allocation still goes through a MemoryTracker by
// category, so the peaks are the ones a run would reach, and the work recorded between
// collectives is the step's compute.
//
// A MetaBackend stands for a planned device: device() is that device (the host for
// --device cpu), so the model, the strategies and the optimizer take the same host or
// device path as a run there, and is_meta() says that nothing behind the pointers can
// be read. Pointers are distinct, aligned addresses with bit 60 set, which is not a
// canonical address on x86-64 or AArch64: host code that dereferences one faults at
// once instead of reading garbage. Host code that touches buffer contents asks
// is_meta() (or goes through the backend, whose kernels do nothing here). Results the
// host reads (sum, sum_of_squares) are 0.
#pragma once

#include <cstdint>

#include "shardlm/backend/backend.hpp"
#include "shardlm/backend/meta/compute_work.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm::meta {

inline constexpr uintptr_t kMetaAddressBit = uintptr_t{1} << 60;
// Whether `p` is a meta buffer's address (no storage behind it) rather than memory.
inline bool is_meta_address(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & kMetaAddressBit) != 0;
}

class MetaBackend final : public Backend {
 public:
  // Stands for `planned`; its memory is counted by tracker(), its own (never a real
  // device's or the host's).
  explicit MetaBackend(Device planned);
  ~MetaBackend() override;
  MetaBackend(const MetaBackend&) = delete;
  MetaBackend& operator=(const MetaBackend&) = delete;

  bool is_meta() const override { return true; }
  MemoryTracker& tracker() { return tracker_; }
  // The work recorded since the last call (or construction), and reset.
  ComputeWork take_work();

  Device device() const override { return planned_; }
  std::string description() const override;
  DeviceAllocator& allocator() override;

  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void synchronize() override {}

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, ConstTypedPtr A,
            int lda, ConstTypedPtr B, int ldb, float beta, float* C, int ldc) override;
  void convert(TypedPtr dst, ConstTypedPtr src, int64_t n) override;
  void convert_rows(TypedPtr dst, int64_t ld_dst, ConstTypedPtr src, int64_t ld_src,
                    int64_t rows, int64_t cols) override;
  void round_to(DType dtype, float* dst, const float* src, int64_t n) override;
  void accumulate(float* dst, const float* src, int64_t n) override;

  void add_bias(float* out, const float* bias, int64_t N, int M) override;
  void add_bias(TypedPtr out, const float* in, const float* bias, int64_t N, int M) override;
  void residual_add_bias(float* out, const float* a, const float* branch, const float* bias,
                         int64_t N, int M) override;
  void bias_backward(float* dbias, const float* dout, int64_t N, int M) override;
  void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in, const float* bias,
                         int64_t N, int M) override;
  void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre, int64_t count) override;
  void swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float* gate_up_in, int64_t N,
                      int I) override;
  void swiglu_backward(float* dgate_up, const float* dh, ConstTypedPtr gate_up, int64_t N,
                       int I) override;

  void layernorm_forward(TypedPtr out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t N, int C) override;
  void residual_layernorm_forward(float* residual, TypedPtr out, float* mean, float* rstd,
                                  const float* a, const float* branch, const float* branch_bias,
                                  const float* weight, const float* bias, int64_t N,
                                  int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t N, int C) override;
  void rmsnorm_forward(TypedPtr y, int64_t ld_y, float* rstd, ConstTypedPtr x, int64_t ld_x,
                       const float* weight, const RmsNormShape& shape, float eps) override;
  void residual_rmsnorm_forward(float* residual, TypedPtr y, float* rstd, const float* a,
                                const float* branch, const float* branch_bias,
                                const float* weight, int64_t N, int C, float eps) override;
  void rmsnorm_backward(float* dx, int64_t ld_dx, float* dweight, const float* dy, int64_t ld_dy,
                        ConstTypedPtr x, int64_t ld_x, const float* weight, const float* rstd,
                        const RmsNormShape& shape, bool accumulate_dx) override;

  void rope_forward(TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x, int64_t rows,
                    int heads, int head_dim, const int32_t* positions,
                    const RopeTableView& table) override;
  void rope_backward(float* dx, int64_t ld_dx, const float* dy, int64_t ld_dy, int64_t rows,
                     int heads, int head_dim, const int32_t* positions,
                     const RopeTableView& table) override;
  void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, const AttentionShape& s,
                         const int32_t* key_begin) override;
  void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                          const float* lse, const AttentionShape& s,
                          const int32_t* key_begin) override;
  void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q,
                               ConstTypedPtr kv, const AttentionBlockShape& s,
                               const int32_t* key_range) override;
  void attention_block_backward(float* dq, float* dkv, const float* dout, ConstTypedPtr out,
                                const float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                                const AttentionBlockShape& s, const int32_t* key_range) override;
  void attention_lse_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                           const AttentionBlockShape& s) override;
  void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte, ConstTypedPtr wpe,
                         int B, int T, int C, DType value_type, const int32_t* positions) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C, const int32_t* positions) override;

  void lm_head_cross_entropy(const LmHeadLossArgs& args, float* losses, float* dx,
                             float* dweight) override;
  double sum(const float* data, int64_t n) override;
  void vocab_shard_localize(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                            VocabShardRows shard) override;
  void vocab_shard_mask_rows(float* rows, const int32_t* tokens, int64_t n, int C,
                             VocabShardRows shard) override;
  void vocab_shard_row_max(float* row_max, const float* logits, int64_t ld, int rows,
                           VocabShardRows shard) override;
  void vocab_shard_softmax_sums(float* sums, float* logits, int64_t ld, const float* row_max,
                                const int32_t* targets, int rows, VocabShardRows shard) override;
  void vocab_shard_loss(float* losses, const float* row_max, const float* sums,
                        const int32_t* targets, int rows) override;
  void vocab_shard_softmax_backward(float* logits, int64_t ld, const float* sums,
                                    const int32_t* targets, int rows, float grad_scale,
                                    VocabShardRows shard) override;
  void nf4_dequantize(const void* in, int64_t n, TypedPtr out) override;
  void gather_rows(TypedPtr dst, ConstTypedPtr src, const int32_t* index, int64_t rows,
                   int64_t width) override;
  void scatter_add_rows(float* out, const float* src, const int32_t* index, const float* weight,
                        int64_t rows, int64_t width) override;
  void moe_assignment_weights(float* weight, const float* top_weight, const int32_t* token,
                              const int32_t* slot, int k, int64_t rows) override;
  void moe_scatter_weight_grads(float* d_top_weight, const float* dot, const int32_t* token,
                                const int32_t* slot, int k, int64_t rows) override;
  void moe_weight_backward(float* dot, float* g, const float* act, int64_t I, float* dy, int64_t C,
                           const float* weight, int64_t rows) override;
  void moe_router_backward(float* dlogits, const float* probs, const int32_t* top_expert,
                           const float* d_top_weight, const float* aux_dprob, int64_t n, int E,
                           int k, bool norm_topk_prob) override;
  void shared_expert_gate_forward(float* gate, float* y, const float* out, int64_t n,
                                  int64_t C) override;
  void shared_expert_gate_backward(float* dz, float* ds, const float* dy, const float* gate,
                                   const float* out, int64_t n, int64_t C) override;
  void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                    std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                    int64_t step, const AdamWConfig& config, TypedPtr rounded_params) override;
  double sum_of_squares(const float* data, int64_t n) override;

 private:
  class Allocator;
  void elementwise(double bytes);
  void state(double bytes);
  const Device planned_;
  MemoryTracker tracker_;
  std::unique_ptr<Allocator> allocator_;
  ComputeWork work_;
};

}  // namespace shardlm::meta
