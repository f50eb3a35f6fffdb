// Backend: the one table of kernels the model, the optimizer and the strategies call
// (docs/architecture.md "Rooms"; ggml's backend vtables are the model). The
// CPU backend (backend/cpu/cpu_backend.cpp) forwards each entry to the cpu:: kernel of
// the same name, so the CPU path computes exactly what it computed before the table
// existed; the CUDA backend (backend/cuda/) implements the same contracts on a GPU.
//
// Contracts are the cpu:: kernels' (their headers document layouts, aliasing, what
// accumulates and what is overwritten); every pointer a kernel takes is memory of the
// backend's device (allocator()), except where an argument says "host". Kernels run in
// order on the backend's stream: a kernel sees every earlier kernel's writes, and
// synchronize() waits for all of them (the CPU backend runs each to completion before
// returning). Results that the host reads (a loss, a sum of squares) come back through
// host arguments and imply that wait.
//
// tests/unit/test_backend_ops.cpp runs every entry on every backend of this build
// against the CPU backend (relative error, ggml's test-backend-ops), and reports a
// backend whose device is absent as skipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "shardlm/core/device.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/backend/attention_block_shape.hpp"
#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm {

struct ElementRange;
struct AdamWConfig;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // "cpu (onednn sgemm)", "cuda:0 (NVIDIA H200, cuBLASLt)": for logs and tables.
  virtual std::string description() const = 0;
  // Allocates the device's memory; TrackedBuffer(category, bytes, allocator()).
  virtual DeviceAllocator& allocator() = 0;
  MemoryTracker& memory_tracker() { return allocator().tracker(); }
  // The meta device (backend/meta): buffers without storage, kernels that record their
  // work instead of computing. Host code that would read or write buffer contents
  // itself (not through this table) skips that on it.
  virtual bool is_meta() const { return false; }

  // --- memory movement (bytes) -------------------------------------------------
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;          // device -> device
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Waits until every kernel issued so far has finished.
  virtual void synchronize() = 0;
  // The stream the kernels run on (a cudaStream_t on CUDA), for work that must be
  // ordered after them without a host wait: the NCCL communicator's collectives.
  // nullptr where kernels run to completion on the calling thread (CPU, emulated).
  virtual void* stream_handle() const { return nullptr; }

  // --- GEMM and conversions ----------------------------------------------------
  // C[M,N] (fp32) = alpha op(A) op(B) + beta C, row-major with row strides, operands
  // fp32 or a compute type, fp32 accumulation (cpu::gemm). beta == 0 ignores C.
  virtual void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                    ConstTypedPtr A, int lda, ConstTypedPtr B, int ldb, float beta, float* C,
                    int ldc) = 0;
  virtual void convert(TypedPtr dst, ConstTypedPtr src, int64_t n) = 0;
  virtual void convert_rows(TypedPtr dst, int64_t ld_dst, ConstTypedPtr src, int64_t ld_src,
                            int64_t rows, int64_t cols) = 0;
  virtual void round_to(DType dtype, float* dst, const float* src, int64_t n) = 0;

  // dst[i] += src[i] (a reduced gradient slice into the owned one).
  virtual void accumulate(float* dst, const float* src, int64_t n) = 0;

  // --- elementwise around GEMMs (cpu/bias.hpp, gelu.hpp, swiglu.hpp) -----------
  virtual void add_bias(float* out, const float* bias, int64_t N, int M) = 0;
  virtual void add_bias(TypedPtr out, const float* in, const float* bias, int64_t N, int M) = 0;
  virtual void residual_add_bias(float* out, const float* a, const float* branch,
                                 const float* bias, int64_t N, int M) = 0;
  virtual void bias_backward(float* dbias, const float* dout, int64_t N, int M) = 0;
  virtual void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in,
                                 const float* bias, int64_t N, int M) = 0;
  virtual void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre,
                             int64_t count) = 0;
  virtual void swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float* gate_up_in,
                              int64_t N, int I) = 0;
  virtual void swiglu_backward(float* dgate_up, const float* dh, ConstTypedPtr gate_up,
                               int64_t N, int I) = 0;

  // --- norms (cpu/layernorm.hpp, rmsnorm.hpp) ------------------------------------
  virtual void layernorm_forward(TypedPtr out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int64_t N, int C) = 0;
  virtual void residual_layernorm_forward(float* residual, TypedPtr out, float* mean,
                                          float* rstd, const float* a, const float* branch,
                                          const float* branch_bias, const float* weight,
                                          const float* bias, int64_t N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int64_t N, int C) = 0;
  virtual void rmsnorm_forward(TypedPtr y, int64_t ld_y, float* rstd, ConstTypedPtr x,
                               int64_t ld_x, const float* weight, const RmsNormShape& shape,
                               float eps) = 0;
  virtual void residual_rmsnorm_forward(float* residual, TypedPtr y, float* rstd,
                                        const float* a, const float* branch,
                                        const float* branch_bias, const float* weight,
                                        int64_t N, int C, float eps) = 0;
  virtual void rmsnorm_backward(float* dx, int64_t ld_dx, float* dweight, const float* dy,
                                int64_t ld_dy, ConstTypedPtr x, int64_t ld_x,
                                const float* weight, const float* rstd,
                                const RmsNormShape& shape, bool accumulate_dx) = 0;

  // --- positions, attention, embeddings -----------------------------------------
  // positions: device memory, each already checked by the caller to lie in
  // [0, table.max_positions).
  virtual void rope_forward(TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x,
                            int64_t rows, int heads, int head_dim, const int32_t* positions,
                            const RopeTableView& table) = 0;
  virtual void rope_backward(float* dx, int64_t ld_dx, const float* dy, int64_t ld_dy,
                             int64_t rows, int heads, int head_dim, const int32_t* positions,
                             const RopeTableView& table) = 0;
  // key_begin: device memory or null, already checked by the caller (0 <= kb <= t).
  virtual void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv,
                                 const AttentionShape& s, const int32_t* key_begin) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv,
                                  ConstTypedPtr out, const float* lse, const AttentionShape& s,
                                  const int32_t* key_begin) = 0;
  // A KV cache's step (cpu::attention_forward_cached: new queries over cached keys
  // and values). Not every backend has it: the default says so, naming the backend.
  virtual void attention_forward_cached(TypedPtr out, ConstTypedPtr q, int64_t ld_q,
                                        ConstTypedPtr k, ConstTypedPtr v, int64_t ld_kv,
                                        const AttentionShape& s, int past);
  // Ring attention's blocks (cpu/attention_block.hpp: queries over another block's keys
  // and values, each query seeing the keys key_range gives it; the log-sum-exp merge of
  // two blocks' results). key_range: device memory.
  virtual void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q,
                                       ConstTypedPtr kv, const AttentionBlockShape& s,
                                       const int32_t* key_range) = 0;
  virtual void attention_block_backward(float* dq, float* dkv, const float* dout,
                                        ConstTypedPtr out, const float* lse, ConstTypedPtr q,
                                        int64_t ld_q, ConstTypedPtr kv,
                                        const AttentionBlockShape& s, const int32_t* key_range) = 0;
  virtual void attention_lse_merge(float* out, float* lse, const float* block_out,
                                   const float* block_lse, const AttentionBlockShape& s) = 0;
  virtual void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte,
                                 ConstTypedPtr wpe, int B, int T, int C, DType value_type,
                                 const int32_t* positions) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C,
                                  const int32_t* positions) = 0;

  // --- loss ----------------------------------------------------------------------
  // losses: [N] on the device (cpu::lm_head_cross_entropy).
  virtual void lm_head_cross_entropy(const LmHeadLossArgs& args, float* losses, float* dx,
                                     float* dweight) = 0;
  // Sum of n device floats in double (the loss), returned to the host; the CPU
  // backend sums in index order.
  virtual double sum(const float* data, int64_t n) = 0;

  // --- vocabulary-parallel embedding and loss (cpu/vocab_shard.hpp) ---------------------
  // A tensor rank's share of the lookup and of the softmax between the GEMMs and the
  // collectives over the tensor group; tokens and targets: device memory.
  virtual void vocab_shard_localize(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                                    VocabShardRows shard) = 0;
  virtual void vocab_shard_mask_rows(float* rows, const int32_t* tokens, int64_t n, int C,
                                     VocabShardRows shard) = 0;
  virtual void vocab_shard_row_max(float* row_max, const float* logits, int64_t ld, int rows,
                                   VocabShardRows shard) = 0;
  virtual void vocab_shard_softmax_sums(float* sums, float* logits, int64_t ld,
                                        const float* row_max, const int32_t* targets, int rows,
                                        VocabShardRows shard) = 0;
  virtual void vocab_shard_loss(float* losses, const float* row_max, const float* sums,
                                const int32_t* targets, int rows) = 0;
  virtual void vocab_shard_softmax_backward(float* logits, int64_t ld, const float* sums,
                                            const int32_t* targets, int rows, float grad_scale,
                                            VocabShardRows shard) = 0;

  // --- mixture of experts (cpu/moe.hpp) ---------------------------------------------
  // The row movement and per-row arithmetic around the expert GEMMs; the routing's index
  // arrays (token, slot, top_expert) are device memory, made on the host and copied.
  virtual void gather_rows(TypedPtr dst, ConstTypedPtr src, const int32_t* index, int64_t rows,
                           int64_t width) = 0;
  virtual void scatter_add_rows(float* out, const float* src, const int32_t* index,
                                const float* weight, int64_t rows, int64_t width) = 0;
  virtual void moe_assignment_weights(float* weight, const float* top_weight,
                                      const int32_t* token, const int32_t* slot, int k,
                                      int64_t rows) = 0;
  virtual void moe_scatter_weight_grads(float* d_top_weight, const float* dot,
                                        const int32_t* token, const int32_t* slot, int k,
                                        int64_t rows) = 0;
  virtual void moe_weight_backward(float* dot, float* g, const float* act, int64_t I, float* dy,
                                   int64_t C, const float* weight, int64_t rows) = 0;
  // aux_dprob: device memory or null.
  virtual void moe_router_backward(float* dlogits, const float* probs, const int32_t* top_expert,
                                   const float* d_top_weight, const float* aux_dprob, int64_t n,
                                   int E, int k, bool norm_topk_prob) = 0;
  virtual void shared_expert_gate_forward(float* gate, float* y, const float* out, int64_t n,
                                          int64_t C) = 0;
  virtual void shared_expert_gate_backward(float* dz, float* ds, const float* dy,
                                           const float* gate, const float* out, int64_t n,
                                           int64_t C) = 0;

  // --- quantized weights ---------------------------------------------------------
  virtual void nf4_dequantize(const void* in, int64_t n, TypedPtr out) = 0;

  // --- optimizer (backend/cpu/adamw.hpp) ------------------------------------------------
  // decay_ranges: host memory.
  virtual void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                            std::span<const ElementRange> decay_ranges, float lr,
                            float grad_multiplier, int64_t step, const AdamWConfig& config,
                            TypedPtr rounded_params) = 0;
  // Sum of squares in double (the global gradient norm), returned to the host.
  virtual double sum_of_squares(const float* data, int64_t n) = 0;
};

// A zeroed buffer on the backend's device: counted by `host_tracker` on the host (tests
// pass their own), by the device's tracker elsewhere (a meta backend's: its own).
TrackedBuffer allocate_on(Backend& backend, MemCategory category, size_t bytes,
                          MemoryTracker& host_tracker = MemoryTracker::global());

// The host's backend (always present).
Backend& cpu_backend();
// The backend of a device: the CPU backend for the host; for CUDA the GPU's backend,
// made on first use. Error naming the device when this build has no CUDA backend
// (built without nvcc) or the machine has no such GPU.
Backend& backend_for(Device device);
// Whether this build compiled the CUDA backend, and how many GPUs it sees (0 without).
bool cuda_backend_compiled();
int cuda_device_count();

}  // namespace shardlm
