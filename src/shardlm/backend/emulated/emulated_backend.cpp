#include "shardlm/backend/emulated/emulated_backend.hpp"

#include <cstdlib>
#include <cstring>

#include "shardlm/core/error.hpp"

namespace shardlm::emulated {

const void* host_address(const void* p, const char* what) {
  if (p == nullptr) return nullptr;
  SHARDLM_CHECK(is_device_pointer(p),
                "emulated device: {} was handed host memory ({}); a device kernel takes device "
                "memory",
                what, p);
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) & ~kDeviceTag);
}

namespace {

class EmulatedAllocator final : public DeviceAllocator {
 public:
  Device device() const override { return {DeviceKind::emulated, 0}; }
  void* allocate(size_t bytes, std::string_view what) override {
    void* host = host_allocator().allocate(bytes, what);
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host) | kDeviceTag);
  }
  void deallocate(void* data, size_t bytes) override {
    host_allocator().deallocate(host_view(data, "deallocate"), bytes);
  }
};

// Untagging shorthands for the table below; `k` names the kernel in errors.
template <typename T>
T* dev(T* p, const char* k) {
  return host_view(p, k);
}
TypedPtr dev(TypedPtr p, const char* k) { return TypedPtr(host_view(p.data, k), p.dtype); }
ConstTypedPtr dev(ConstTypedPtr p, const char* k) {
  return ConstTypedPtr(host_view(p.data, k), p.dtype);
}

class EmulatedBackend final : public Backend {
 public:
  Device device() const override { return {DeviceKind::emulated, 0}; }
  std::string description() const override {
    return "emulated device (cpu kernels on tagged memory)";
  }
  DeviceAllocator& allocator() override { return allocator_; }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dev(dst, "copy"), dev(src, "copy"), bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    SHARDLM_CHECK(!is_device_pointer(host_dst), "emulated device: copy_to_host into device memory");
    if (bytes > 0) std::memcpy(host_dst, dev(src, "copy_to_host"), bytes);
  }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    SHARDLM_CHECK(!is_device_pointer(host_src),
                  "emulated device: copy_from_host from device memory");
    if (bytes > 0) std::memcpy(dev(dst, "copy_from_host"), host_src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dev(dst, "fill_zero"), 0, bytes);
  }
  void synchronize() override {}

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, ConstTypedPtr A,
            int lda, ConstTypedPtr B, int ldb, float beta, float* C, int ldc) override {
    cpu_.gemm(trans_a, trans_b, M, N, K, alpha, dev(A, "gemm"), lda, dev(B, "gemm"), ldb, beta,
              dev(C, "gemm"), ldc);
  }
  void convert(TypedPtr dst, ConstTypedPtr src, int64_t n) override {
    cpu_.convert(dev(dst, "convert"), dev(src, "convert"), n);
  }
  void convert_rows(TypedPtr dst, int64_t ld_dst, ConstTypedPtr src, int64_t ld_src, int64_t rows,
                    int64_t cols) override {
    cpu_.convert_rows(dev(dst, "convert_rows"), ld_dst, dev(src, "convert_rows"), ld_src, rows,
                      cols);
  }
  void round_to(DType dtype, float* dst, const float* src, int64_t n) override {
    cpu_.round_to(dtype, dev(dst, "round_to"), dev(src, "round_to"), n);
  }

  void accumulate(float* dst, const float* src, int64_t n) override {
    cpu_.accumulate(dev(dst, "accumulate"), dev(src, "accumulate"), n);
  }

  void add_bias(float* out, const float* bias, int64_t N, int M) override {
    cpu_.add_bias(dev(out, "add_bias"), dev(bias, "add_bias"), N, M);
  }
  void add_bias(TypedPtr out, const float* in, const float* bias, int64_t N, int M) override {
    cpu_.add_bias(dev(out, "add_bias"), dev(in, "add_bias"), dev(bias, "add_bias"), N, M);
  }
  void residual_add_bias(float* out, const float* a, const float* branch, const float* bias,
                         int64_t N, int M) override {
    const char* k = "residual_add_bias";
    cpu_.residual_add_bias(dev(out, k), dev(a, k), dev(branch, k), dev(bias, k), N, M);
  }
  void bias_backward(float* dbias, const float* dout, int64_t N, int M) override {
    cpu_.bias_backward(dev(dbias, "bias_backward"), dev(dout, "bias_backward"), N, M);
  }
  void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in, const float* bias,
                         int64_t N, int M) override {
    const char* k = "bias_gelu_forward";
    cpu_.bias_gelu_forward(dev(out, k), dev(pre_out, k), dev(pre_in, k), dev(bias, k), N, M);
  }
  void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre, int64_t count) override {
    const char* k = "gelu_backward";
    cpu_.gelu_backward(dev(dinp, k), dev(dout, k), dev(pre, k), count);
  }
  void swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float* gate_up_in, int64_t N,
                      int I) override {
    const char* k = "swiglu_forward";
    cpu_.swiglu_forward(dev(h, k), dev(gate_up_out, k), dev(gate_up_in, k), N, I);
  }
  void swiglu_backward(float* dgate_up, const float* dh, ConstTypedPtr gate_up, int64_t N,
                       int I) override {
    const char* k = "swiglu_backward";
    cpu_.swiglu_backward(dev(dgate_up, k), dev(dh, k), dev(gate_up, k), N, I);
  }

  void layernorm_forward(TypedPtr out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t N, int C) override {
    const char* k = "layernorm_forward";
    cpu_.layernorm_forward(dev(out, k), dev(mean, k), dev(rstd, k), dev(inp, k), dev(weight, k),
                           dev(bias, k), N, C);
  }
  void residual_layernorm_forward(float* residual, TypedPtr out, float* mean, float* rstd,
                                  const float* a, const float* branch, const float* branch_bias,
                                  const float* weight, const float* bias, int64_t N,
                                  int C) override {
    const char* k = "residual_layernorm_forward";
    cpu_.residual_layernorm_forward(dev(residual, k), dev(out, k), dev(mean, k), dev(rstd, k),
                                    dev(a, k), dev(branch, k), dev(branch_bias, k),
                                    dev(weight, k), dev(bias, k), N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t N, int C) override {
    const char* k = "layernorm_backward";
    cpu_.layernorm_backward(dev(dinp, k), dev(dweight, k), dev(dbias, k), dev(dout, k),
                            dev(inp, k), dev(weight, k), dev(mean, k), dev(rstd, k), N, C);
  }
  void rmsnorm_forward(TypedPtr y, int64_t ld_y, float* rstd, ConstTypedPtr x, int64_t ld_x,
                       const float* weight, const RmsNormShape& shape, float eps) override {
    const char* k = "rmsnorm_forward";
    cpu_.rmsnorm_forward(dev(y, k), ld_y, dev(rstd, k), dev(x, k), ld_x, dev(weight, k), shape,
                         eps);
  }
  void residual_rmsnorm_forward(float* residual, TypedPtr y, float* rstd, const float* a,
                                const float* branch, const float* branch_bias,
                                const float* weight, int64_t N, int C, float eps) override {
    const char* k = "residual_rmsnorm_forward";
    cpu_.residual_rmsnorm_forward(dev(residual, k), dev(y, k), dev(rstd, k), dev(a, k),
                                  dev(branch, k), dev(branch_bias, k), dev(weight, k), N, C, eps);
  }
  void rmsnorm_backward(float* dx, int64_t ld_dx, float* dweight, const float* dy, int64_t ld_dy,
                        ConstTypedPtr x, int64_t ld_x, const float* weight, const float* rstd,
                        const RmsNormShape& shape, bool accumulate_dx) override {
    const char* k = "rmsnorm_backward";
    cpu_.rmsnorm_backward(dev(dx, k), ld_dx, dev(dweight, k), dev(dy, k), ld_dy, dev(x, k), ld_x,
                          dev(weight, k), dev(rstd, k), shape, accumulate_dx);
  }

  void rope_forward(TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x, int64_t rows,
                    int heads, int head_dim, const int32_t* positions,
                    const RopeTableView& table) override {
    const char* k = "rope_forward";
    cpu_.rope_forward(dev(y, k), ld_y, dev(x, k), ld_x, rows, heads, head_dim, dev(positions, k),
                      rope(table, k));
  }
  void rope_backward(float* dx, int64_t ld_dx, const float* dy, int64_t ld_dy, int64_t rows,
                     int heads, int head_dim, const int32_t* positions,
                     const RopeTableView& table) override {
    const char* k = "rope_backward";
    cpu_.rope_backward(dev(dx, k), ld_dx, dev(dy, k), ld_dy, rows, heads, head_dim,
                       dev(positions, k), rope(table, k));
  }
  void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, const AttentionShape& s,
                         const int32_t* key_begin) override {
    const char* k = "attention_forward";
    cpu_.attention_forward(dev(out, k), dev(lse, k), dev(qkv, k), s, dev(key_begin, k));
  }
  void attention_forward_cached(TypedPtr out, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr k,
                                ConstTypedPtr v, int64_t ld_kv, const AttentionShape& s,
                                int past) override {
    const char* what = "attention_forward_cached";
    cpu_.attention_forward_cached(dev(out, what), dev(q, what), ld_q, dev(k, what), dev(v, what),
                                  ld_kv, s, past);
  }
  void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                          const float* lse, const AttentionShape& s,
                          const int32_t* key_begin) override {
    const char* k = "attention_backward";
    cpu_.attention_backward(dev(dqkv, k), dev(dout, k), dev(qkv, k), dev(out, k), dev(lse, k), s,
                            dev(key_begin, k));
  }
  void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q,
                               ConstTypedPtr kv, const AttentionBlockShape& s,
                               const int32_t* key_range) override {
    const char* k = "attention_block_forward";
    cpu_.attention_block_forward(dev(out, k), dev(lse, k), dev(q, k), ld_q, dev(kv, k), s,
                                 dev(key_range, k));
  }
  void attention_block_backward(float* dq, float* dkv, const float* dout, ConstTypedPtr out,
                                const float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                                const AttentionBlockShape& s, const int32_t* key_range) override {
    const char* k = "attention_block_backward";
    cpu_.attention_block_backward(dev(dq, k), dev(dkv, k), dev(dout, k), dev(out, k), dev(lse, k),
                                  dev(q, k), ld_q, dev(kv, k), s, dev(key_range, k));
  }
  void attention_lse_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                           const AttentionBlockShape& s) override {
    const char* k = "attention_lse_merge";
    cpu_.attention_lse_merge(dev(out, k), dev(lse, k), dev(block_out, k), dev(block_lse, k), s);
  }
  void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte, ConstTypedPtr wpe,
                         int B, int T, int C, DType value_type,
                         const int32_t* positions) override {
    const char* k = "embedding_forward";
    cpu_.embedding_forward(dev(out, k), dev(tokens, k), dev(wte, k), dev(wpe, k), B, T, C,
                           value_type, dev(positions, k));
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C, const int32_t* positions) override {
    const char* k = "embedding_backward";
    cpu_.embedding_backward(dev(dwte, k), dev(dwpe, k), dev(dout, k), dev(tokens, k), B, T, C,
                            dev(positions, k));
  }

  void lm_head_cross_entropy(const LmHeadLossArgs& args, float* losses, float* dx,
                             float* dweight) override {
    const char* k = "lm_head_cross_entropy";
    LmHeadLossArgs host = args;
    host.x = dev(args.x, k);
    host.weight = dev(args.weight, k);
    host.targets = dev(args.targets, k);
    host.logits_scratch = dev(args.logits_scratch, k);
    host.dlogits_scratch = dev(args.dlogits_scratch, k);
    cpu_.lm_head_cross_entropy(host, dev(losses, k), dev(dx, k), dev(dweight, k));
  }
  double sum(const float* data, int64_t n) override { return cpu_.sum(dev(data, "sum"), n); }

  void vocab_shard_localize(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                            VocabShardRows shard) override {
    const char* k = "vocab_shard_localize";
    cpu_.vocab_shard_localize(dev(local_tokens, k), dev(tokens, k), n, shard);
  }
  void vocab_shard_mask_rows(float* rows, const int32_t* tokens, int64_t n, int C,
                             VocabShardRows shard) override {
    const char* k = "vocab_shard_mask_rows";
    cpu_.vocab_shard_mask_rows(dev(rows, k), dev(tokens, k), n, C, shard);
  }
  void vocab_shard_row_max(float* row_max, const float* logits, int64_t ld, int rows,
                           VocabShardRows shard) override {
    const char* k = "vocab_shard_row_max";
    cpu_.vocab_shard_row_max(dev(row_max, k), dev(logits, k), ld, rows, shard);
  }
  void vocab_shard_softmax_sums(float* sums, float* logits, int64_t ld, const float* row_max,
                                const int32_t* targets, int rows, VocabShardRows shard) override {
    const char* k = "vocab_shard_softmax_sums";
    cpu_.vocab_shard_softmax_sums(dev(sums, k), dev(logits, k), ld, dev(row_max, k),
                                  dev(targets, k), rows, shard);
  }
  void vocab_shard_loss(float* losses, const float* row_max, const float* sums,
                        const int32_t* targets, int rows) override {
    const char* k = "vocab_shard_loss";
    cpu_.vocab_shard_loss(dev(losses, k), dev(row_max, k), dev(sums, k), dev(targets, k), rows);
  }
  void vocab_shard_softmax_backward(float* logits, int64_t ld, const float* sums,
                                    const int32_t* targets, int rows, float grad_scale,
                                    VocabShardRows shard) override {
    const char* k = "vocab_shard_softmax_backward";
    cpu_.vocab_shard_softmax_backward(dev(logits, k), ld, dev(sums, k), dev(targets, k), rows,
                                      grad_scale, shard);
  }

  void gather_rows(TypedPtr dst, ConstTypedPtr src, const int32_t* index, int64_t rows,
                   int64_t width) override {
    const char* k = "gather_rows";
    cpu_.gather_rows(dev(dst, k), dev(src, k), dev(index, k), rows, width);
  }
  void scatter_add_rows(float* out, const float* src, const int32_t* index, const float* weight,
                        int64_t rows, int64_t width) override {
    const char* k = "scatter_add_rows";
    cpu_.scatter_add_rows(dev(out, k), dev(src, k), dev(index, k), dev(weight, k), rows, width);
  }
  void moe_assignment_weights(float* weight, const float* top_weight, const int32_t* token,
                              const int32_t* slot, int k, int64_t rows) override {
    const char* n = "moe_assignment_weights";
    cpu_.moe_assignment_weights(dev(weight, n), dev(top_weight, n), dev(token, n), dev(slot, n),
                                k, rows);
  }
  void moe_scatter_weight_grads(float* d_top_weight, const float* dot, const int32_t* token,
                                const int32_t* slot, int k, int64_t rows) override {
    const char* n = "moe_scatter_weight_grads";
    cpu_.moe_scatter_weight_grads(dev(d_top_weight, n), dev(dot, n), dev(token, n), dev(slot, n),
                                  k, rows);
  }
  void moe_weight_backward(float* dot, float* g, const float* act, int64_t I, float* dy, int64_t C,
                           const float* weight, int64_t rows) override {
    const char* k = "moe_weight_backward";
    cpu_.moe_weight_backward(dev(dot, k), dev(g, k), dev(act, k), I, dev(dy, k), C,
                             dev(weight, k), rows);
  }
  void moe_router_backward(float* dlogits, const float* probs, const int32_t* top_expert,
                           const float* d_top_weight, const float* aux_dprob, int64_t n, int E,
                           int k, bool norm_topk_prob) override {
    const char* x = "moe_router_backward";
    cpu_.moe_router_backward(dev(dlogits, x), dev(probs, x), dev(top_expert, x),
                             dev(d_top_weight, x), dev(aux_dprob, x), n, E, k, norm_topk_prob);
  }
  void shared_expert_gate_forward(float* gate, float* y, const float* out, int64_t n,
                                  int64_t C) override {
    const char* k = "shared_expert_gate_forward";
    cpu_.shared_expert_gate_forward(dev(gate, k), dev(y, k), dev(out, k), n, C);
  }
  void shared_expert_gate_backward(float* dz, float* ds, const float* dy, const float* gate,
                                   const float* out, int64_t n, int64_t C) override {
    const char* k = "shared_expert_gate_backward";
    cpu_.shared_expert_gate_backward(dev(dz, k), dev(ds, k), dev(dy, k), dev(gate, k),
                                     dev(out, k), n, C);
  }

  void nf4_dequantize(const void* in, int64_t n, TypedPtr out) override {
    cpu_.nf4_dequantize(dev(in, "nf4_dequantize"), n, dev(out, "nf4_dequantize"));
  }

  void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                    std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                    int64_t step, const AdamWConfig& config, TypedPtr rounded_params) override {
    const char* k = "adamw_update";
    cpu_.adamw_update(dev(params, k), dev(grads, k), dev(m, k), dev(v, k), n, decay_ranges, lr,
                      grad_multiplier, step, config, dev(rounded_params, k));
  }
  double sum_of_squares(const float* data, int64_t n) override {
    return cpu_.sum_of_squares(dev(data, "sum_of_squares"), n);
  }

 private:
  static RopeTableView rope(const RopeTableView& t, const char* k) {
    return {dev(t.cos, k), dev(t.sin, k), t.head_dim, t.max_positions};
  }
  Backend& cpu_ = cpu_backend();
  EmulatedAllocator allocator_;
};

}  // namespace

Backend& backend() {
  static EmulatedBackend backend;
  return backend;
}

}  // namespace shardlm::emulated
