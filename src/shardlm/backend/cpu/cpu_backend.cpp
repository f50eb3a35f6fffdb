// The CPU backend: every entry of the table is the cpu:: kernel of the same name, on
// host memory, so going through the table changes nothing the CPU computes.
#include <cstring>

#include "shardlm/backend/backend.hpp"
#include "shardlm/backend/cpu/adamw.hpp"
#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/attention_block.hpp"
#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/embedding.hpp"
#include "shardlm/backend/cpu/gelu.hpp"
#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/cpu/lm_head_loss.hpp"
#include "shardlm/backend/cpu/moe.hpp"
#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/backend/cpu/rmsnorm.hpp"
#include "shardlm/backend/cpu/rope.hpp"
#include "shardlm/backend/cpu/swiglu.hpp"
#include "shardlm/backend/cpu/vocab_shard.hpp"

namespace shardlm {

namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return {DeviceKind::cpu, 0}; }
  std::string description() const override {
    return std::string("cpu (") + cpu::gemm_library_name() + " sgemm)";
  }
  DeviceAllocator& allocator() override { return host_allocator(); }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    copy(host_dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    copy(dst, host_src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }
  void synchronize() override {}

  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, ConstTypedPtr A,
            int lda, ConstTypedPtr B, int ldb, float beta, float* C, int ldc) override {
    cpu::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void convert(TypedPtr dst, ConstTypedPtr src, int64_t n) override { cpu::convert(dst, src, n); }
  void convert_rows(TypedPtr dst, int64_t ld_dst, ConstTypedPtr src, int64_t ld_src, int64_t rows,
                    int64_t cols) override {
    cpu::convert_rows(dst, ld_dst, src, ld_src, rows, cols);
  }
  void round_to(DType dtype, float* dst, const float* src, int64_t n) override {
    cpu::round_to(dtype, dst, src, n);
  }

  void accumulate(float* dst, const float* src, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  void add_bias(float* out, const float* bias, int64_t N, int M) override {
    cpu::add_bias(out, bias, N, M);
  }
  void add_bias(TypedPtr out, const float* in, const float* bias, int64_t N, int M) override {
    cpu::add_bias(out, in, bias, N, M);
  }
  void residual_add_bias(float* out, const float* a, const float* branch, const float* bias,
                         int64_t N, int M) override {
    cpu::residual_add_bias(out, a, branch, bias, N, M);
  }
  void bias_backward(float* dbias, const float* dout, int64_t N, int M) override {
    cpu::bias_backward(dbias, dout, N, M);
  }
  void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in, const float* bias,
                         int64_t N, int M) override {
    cpu::bias_gelu_forward(out, pre_out, pre_in, bias, N, M);
  }
  void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre, int64_t count) override {
    cpu::gelu_backward(dinp, dout, pre, count);
  }
  void swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float* gate_up_in, int64_t N,
                      int I) override {
    cpu::swiglu_forward(h, gate_up_out, gate_up_in, N, I);
  }
  void swiglu_backward(float* dgate_up, const float* dh, ConstTypedPtr gate_up, int64_t N,
                       int I) override {
    cpu::swiglu_backward(dgate_up, dh, gate_up, N, I);
  }

  void layernorm_forward(TypedPtr out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t N, int C) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void residual_layernorm_forward(float* residual, TypedPtr out, float* mean, float* rstd,
                                  const float* a, const float* branch, const float* branch_bias,
                                  const float* weight, const float* bias, int64_t N,
                                  int C) override {
    cpu::residual_layernorm_forward(residual, out, mean, rstd, a, branch, branch_bias, weight,
                                    bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(TypedPtr y, int64_t ld_y, float* rstd, ConstTypedPtr x, int64_t ld_x,
                       const float* weight, const RmsNormShape& shape, float eps) override {
    cpu::rmsnorm_forward(y, ld_y, rstd, x, ld_x, weight, shape, eps);
  }
  void residual_rmsnorm_forward(float* residual, TypedPtr y, float* rstd, const float* a,
                                const float* branch, const float* branch_bias,
                                const float* weight, int64_t N, int C, float eps) override {
    cpu::residual_rmsnorm_forward(residual, y, rstd, a, branch, branch_bias, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dx, int64_t ld_dx, float* dweight, const float* dy, int64_t ld_dy,
                        ConstTypedPtr x, int64_t ld_x, const float* weight, const float* rstd,
                        const RmsNormShape& shape, bool accumulate_dx) override {
    cpu::rmsnorm_backward(dx, ld_dx, dweight, dy, ld_dy, x, ld_x, weight, rstd, shape,
                          accumulate_dx);
  }

  void rope_forward(TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x, int64_t rows,
                    int heads, int head_dim, const int32_t* positions,
                    const RopeTableView& table) override {
    cpu::rope_forward(y, ld_y, x, ld_x, rows, heads, head_dim, positions, table);
  }
  void rope_backward(float* dx, int64_t ld_dx, const float* dy, int64_t ld_dy, int64_t rows,
                     int heads, int head_dim, const int32_t* positions,
                     const RopeTableView& table) override {
    cpu::rope_backward(dx, ld_dx, dy, ld_dy, rows, heads, head_dim, positions, table);
  }
  void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, const AttentionShape& s,
                         const int32_t* key_begin) override {
    cpu::attention_forward(out, lse, qkv, s, key_begin);
  }
  void attention_forward_cached(TypedPtr out, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr k,
                                ConstTypedPtr v, int64_t ld_kv, const AttentionShape& s,
                                int past) override {
    cpu::attention_forward_cached(out, q, ld_q, k, v, ld_kv, s, past);
  }
  void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                          const float* lse, const AttentionShape& s,
                          const int32_t* key_begin) override {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, s, key_begin);
  }
  void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q,
                               ConstTypedPtr kv, const AttentionBlockShape& s,
                               const int32_t* key_range) override {
    cpu::attention_block_forward(out, lse, q, ld_q, kv, s, key_range);
  }
  void attention_block_backward(float* dq, float* dkv, const float* dout, ConstTypedPtr out,
                                const float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                                const AttentionBlockShape& s, const int32_t* key_range) override {
    cpu::attention_block_backward(dq, dkv, dout, out, lse, q, ld_q, kv, s, key_range);
  }
  void attention_lse_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                           const AttentionBlockShape& s) override {
    cpu::attention_lse_merge(out, lse, block_out, block_lse, s);
  }
  void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte, ConstTypedPtr wpe,
                         int B, int T, int C, DType value_type,
                         const int32_t* positions) override {
    cpu::embedding_forward(out, tokens, wte, wpe, B, T, C, value_type, positions);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C, const int32_t* positions) override {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, positions);
  }

  void lm_head_cross_entropy(const LmHeadLossArgs& args, float* losses, float* dx,
                             float* dweight) override {
    cpu::lm_head_cross_entropy(args, losses, dx, dweight);
  }
  double sum(const float* data, int64_t n) override {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += data[i];
    return total;
  }

  void vocab_shard_localize(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                            VocabShardRows shard) override {
    cpu::vocab_shard_localize(local_tokens, tokens, n, shard);
  }
  void vocab_shard_mask_rows(float* rows, const int32_t* tokens, int64_t n, int C,
                             VocabShardRows shard) override {
    cpu::vocab_shard_mask_rows(rows, tokens, n, C, shard);
  }
  void vocab_shard_row_max(float* row_max, const float* logits, int64_t ld, int rows,
                           VocabShardRows shard) override {
    cpu::vocab_shard_row_max(row_max, logits, ld, rows, shard);
  }
  void vocab_shard_softmax_sums(float* sums, float* logits, int64_t ld, const float* row_max,
                                const int32_t* targets, int rows, VocabShardRows shard) override {
    cpu::vocab_shard_softmax_sums(sums, logits, ld, row_max, targets, rows, shard);
  }
  void vocab_shard_loss(float* losses, const float* row_max, const float* sums,
                        const int32_t* targets, int rows) override {
    cpu::vocab_shard_loss(losses, row_max, sums, targets, rows);
  }
  void vocab_shard_softmax_backward(float* logits, int64_t ld, const float* sums,
                                    const int32_t* targets, int rows, float grad_scale,
                                    VocabShardRows shard) override {
    cpu::vocab_shard_softmax_backward(logits, ld, sums, targets, rows, grad_scale, shard);
  }

  void gather_rows(TypedPtr dst, ConstTypedPtr src, const int32_t* index, int64_t rows,
                   int64_t width) override {
    cpu::gather_rows(dst, src, index, rows, width);
  }
  void scatter_add_rows(float* out, const float* src, const int32_t* index, const float* weight,
                        int64_t rows, int64_t width) override {
    cpu::scatter_add_rows(out, src, index, weight, rows, width);
  }
  void moe_assignment_weights(float* weight, const float* top_weight, const int32_t* token,
                              const int32_t* slot, int k, int64_t rows) override {
    cpu::moe_assignment_weights(weight, top_weight, token, slot, k, rows);
  }
  void moe_scatter_weight_grads(float* d_top_weight, const float* dot, const int32_t* token,
                                const int32_t* slot, int k, int64_t rows) override {
    cpu::moe_scatter_weight_grads(d_top_weight, dot, token, slot, k, rows);
  }
  void moe_weight_backward(float* dot, float* g, const float* act, int64_t I, float* dy, int64_t C,
                           const float* weight, int64_t rows) override {
    cpu::moe_weight_backward(dot, g, act, I, dy, C, weight, rows);
  }
  void moe_router_backward(float* dlogits, const float* probs, const int32_t* top_expert,
                           const float* d_top_weight, const float* aux_dprob, int64_t n, int E,
                           int k, bool norm_topk_prob) override {
    cpu::moe_router_backward(dlogits, probs, top_expert, d_top_weight, aux_dprob, n, E, k,
                             norm_topk_prob);
  }
  void shared_expert_gate_forward(float* gate, float* y, const float* out, int64_t n,
                                  int64_t C) override {
    cpu::shared_expert_gate_forward(gate, y, out, n, C);
  }
  void shared_expert_gate_backward(float* dz, float* ds, const float* dy, const float* gate,
                                   const float* out, int64_t n, int64_t C) override {
    cpu::shared_expert_gate_backward(dz, ds, dy, gate, out, n, C);
  }

  void nf4_dequantize(const void* in, int64_t n, TypedPtr out) override {
    cpu::nf4_dequantize(in, n, out);
  }

  void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                    std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                    int64_t step, const AdamWConfig& config, TypedPtr rounded_params) override {
    ::shardlm::adamw_update(params, grads, m, v, n, decay_ranges, lr, grad_multiplier, step,
                            config, rounded_params);
  }
  double sum_of_squares(const float* data, int64_t n) override {
    return ::shardlm::sum_of_squares(data, n);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace shardlm
