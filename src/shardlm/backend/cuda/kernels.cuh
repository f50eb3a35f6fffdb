// Launchers of shardlm's own CUDA kernels (kernels_elementwise.cu, kernels_reduce.cu),
// called by the CUDA backend (cuda_backend.cpp). Each enqueues its kernels on `stream`
// and returns cudaGetLastError() after the launch (the caller checks it and names the
// launcher); none synchronizes. Contracts are the cpu:: kernels' of the same name
// (backend/cpu/*.hpp): layouts, aliasing, what accumulates and what is overwritten.
//
// Deterministic by construction: no atomics; every reduction has an order fixed by the
// shapes alone (warp butterflies, fixed chunks summed in index order), so a run repeats
// bit for bit on the same GPU.
//
// This header is read by g++ (the backend) and nvcc (the kernels): no CUDA-only syntax.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/dtype.hpp"

namespace shardlm::cuda::kernels {

// --- conversions ----------------------------------------------------------------------
cudaError_t convert(cudaStream_t stream, TypedPtr dst, ConstTypedPtr src, int64_t n);
cudaError_t convert_rows(cudaStream_t stream, TypedPtr dst, int64_t ld_dst, ConstTypedPtr src,
                         int64_t ld_src, int64_t rows, int64_t cols);
cudaError_t round_to(cudaStream_t stream, DType dtype, float* dst, const float* src, int64_t n);
// dst[i] += src[i] (a reduced gradient slice into the owned one).
cudaError_t accumulate(cudaStream_t stream, float* dst, const float* src, int64_t n);
// C[r, c] = beta * C[r, c] for a [rows, cols] matrix with row stride ld (beta == 0 writes
// zeros without reading C): a GEMM with K = 0.
cudaError_t scale_rows(cudaStream_t stream, float* C, int64_t ld, int64_t rows, int64_t cols,
                       float beta);

// --- elementwise around GEMMs -----------------------------------------------------------
cudaError_t add_bias_inplace(cudaStream_t stream, float* out, const float* bias, int64_t N, int M);
cudaError_t add_bias(cudaStream_t stream, TypedPtr out, const float* in, const float* bias,
                     int64_t N, int M);
cudaError_t residual_add_bias(cudaStream_t stream, float* out, const float* a, const float* branch,
                              const float* bias, int64_t N, int M);
cudaError_t bias_gelu_forward(cudaStream_t stream, TypedPtr out, TypedPtr pre_out,
                              const float* pre_in, const float* bias, int64_t N, int M);
cudaError_t gelu_backward(cudaStream_t stream, float* dinp, const float* dout, ConstTypedPtr pre,
                          int64_t count);
cudaError_t swiglu_forward(cudaStream_t stream, TypedPtr h, TypedPtr gate_up_out,
                           const float* gate_up_in, int64_t N, int I);
cudaError_t swiglu_backward(cudaStream_t stream, float* dgate_up, const float* dh,
                            ConstTypedPtr gate_up, int64_t N, int I);

// --- positions, embeddings, quantized weights -------------------------------------------
// sign +1: y = R x (forward, y in its type); -1: R^T (backward, fp32).
cudaError_t rope_rotate(cudaStream_t stream, TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x,
                        int64_t rows, int heads, int head_dim, const int32_t* positions,
                        const RopeTableView& table, float sign);
cudaError_t embedding_forward(cudaStream_t stream, float* out, const int32_t* tokens,
                              ConstTypedPtr wte, ConstTypedPtr wpe, int B, int T, int C,
                              DType value_type, const int32_t* positions);
// order_scratch: 2 B T int32 of device memory (the batch's rows in token order, then in
// position order), which the launches use while they run. B T < 2^31.
cudaError_t embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const float* dout,
                               const int32_t* tokens, int B, int T, int C,
                               const int32_t* positions, int32_t* order_scratch);
cudaError_t nf4_dequantize(cudaStream_t stream, const void* in, int64_t n, TypedPtr out);

// --- vocabulary-parallel lookup and loss (cpu/vocab_shard.hpp's contracts) ----------------------
// Elementwise (kernels_elementwise.cu):
cudaError_t vocab_shard_localize(cudaStream_t stream, int32_t* local_tokens, const int32_t* tokens,
                                 int64_t n, VocabShardRows shard);
cudaError_t vocab_shard_mask_rows(cudaStream_t stream, float* rows, const int32_t* tokens, int64_t n,
                                  int C, VocabShardRows shard);
cudaError_t vocab_shard_loss(cudaStream_t stream, float* losses, const float* row_max,
                             const float* sums, const int32_t* targets, int rows);
cudaError_t vocab_shard_softmax_backward(cudaStream_t stream, float* logits, int64_t ld,
                                         const float* sums, const int32_t* targets, int rows,
                                         float grad_scale, VocabShardRows shard);
// A warp per row (kernels_reduce.cu): the sums run in lane order, not the CPU's column
// order (a few fp32 ulps apart).
cudaError_t vocab_shard_row_max(cudaStream_t stream, float* row_max, const float* logits,
                                int64_t ld, int rows, VocabShardRows shard);
cudaError_t vocab_shard_softmax_sums(cudaStream_t stream, float* sums, float* logits, int64_t ld,
                                     const float* row_max, const int32_t* targets, int rows,
                                     VocabShardRows shard);

// --- mixture of experts (kernels_moe.cu; cpu/moe.hpp's contracts) -----------------------
cudaError_t gather_rows(cudaStream_t stream, TypedPtr dst, ConstTypedPtr src, const int32_t* index,
                        int64_t rows, int64_t width);
cudaError_t scatter_add_rows(cudaStream_t stream, float* out, const float* src,
                             const int32_t* index, const float* weight, int64_t rows,
                             int64_t width);
cudaError_t moe_assignment_weights(cudaStream_t stream, float* weight, const float* top_weight,
                                   const int32_t* token, const int32_t* slot, int k, int64_t rows);
cudaError_t moe_scatter_weight_grads(cudaStream_t stream, float* d_top_weight, const float* dot,
                                     const int32_t* token, const int32_t* slot, int k,
                                     int64_t rows);
cudaError_t moe_weight_backward(cudaStream_t stream, float* dot, float* g, const float* act,
                                int64_t I, float* dy, int64_t C, const float* weight,
                                int64_t rows);
cudaError_t moe_router_backward(cudaStream_t stream, float* dlogits, const float* probs,
                                const int32_t* top_expert, const float* d_top_weight,
                                const float* aux_dprob, int64_t n, int E, int k,
                                bool norm_topk_prob);
cudaError_t shared_expert_gate_forward(cudaStream_t stream, float* gate, float* y, const float* out,
                                       int64_t n, int64_t C);
cudaError_t shared_expert_gate_backward(cudaStream_t stream, float* dz, float* ds, const float* dy,
                                        const float* gate, const float* out, int64_t n,
                                        int64_t C);

// --- AdamW ---------------------------------------------------------------------------------
// The per-step constants, computed on the host exactly as backend/cpu/adamw.cpp does.
struct AdamConstants {
  float decay_factor, grad_multiplier, beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size, bias2_sqrt, eps;
};
// A half-open element range [begin, end) (backend/adamw_config.hpp's ElementRange).
struct HostRange {
  int64_t begin = 0;
  int64_t end = 0;
};
// AdamW over n elements: element i uses `decayed` constants when one of decay_ranges
// (HOST memory, sorted and disjoint) holds it, else `plain`. The ranges travel in the
// launch arguments, up to kAdamInlineRanges per launch; with more, the slice is cut
// where each further batch of ranges begins and each piece launched with its batch.
// rounded_params.data null: no rounded copy, else the updated params in its type.
inline constexpr int kAdamInlineRanges = 32;
cudaError_t adamw_update(cudaStream_t stream, float* params, const float* grads, float* m, float* v,
                         int64_t n, const HostRange* decay_ranges, size_t range_count,
                         const AdamConstants& plain, const AdamConstants& decayed,
                         TypedPtr rounded_params);

// --- norms (one warp per normalized vector) --------------------------------------------------
cudaError_t layernorm_forward(cudaStream_t stream, TypedPtr out, float* mean, float* rstd,
                              float* residual, const float* inp_or_a, const float* branch,
                              const float* branch_bias, const float* weight, const float* bias,
                              int64_t N, int C, float eps);
// dinp accumulates (row kernel); the weight and bias gradients go through column_sums.
cudaError_t layernorm_backward_input(cudaStream_t stream, float* dinp, const float* dout,
                                     const float* inp, const float* weight, const float* mean,
                                     const float* rstd, int64_t N, int C);
cudaError_t rmsnorm_forward(cudaStream_t stream, TypedPtr y, int64_t ld_y, float* rstd,
                            ConstTypedPtr x, int64_t ld_x, const float* weight,
                            const RmsNormShape& shape, float eps);
cudaError_t residual_rmsnorm_forward(cudaStream_t stream, float* residual, TypedPtr y, float* rstd,
                                     const float* a, const float* branch, const float* branch_bias,
                                     const float* weight, int64_t N, int C, float eps);
cudaError_t rmsnorm_backward_input(cudaStream_t stream, float* dx, int64_t ld_dx, const float* dy,
                                   int64_t ld_dy, ConstTypedPtr x, int64_t ld_x,
                                   const float* weight, const float* rstd,
                                   const RmsNormShape& shape, bool accumulate_dx);

// --- deterministic column sums (parameter gradients) -----------------------------------------
// out[c] += sum over rows of a per-element term, in double: rows are cut into chunks of
// kColumnSumChunkRows; a first kernel sums each chunk (fixed thread mapping) into
// `partials`, a second adds the chunks in order. partials must hold
// column_sum_partial_bytes(rows, cols, outputs) bytes of device memory.
inline constexpr int64_t kColumnSumChunkRows = 256;
inline size_t column_sum_partial_bytes(int64_t rows, int64_t cols, int outputs) {
  const int64_t chunks = (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
  return static_cast<size_t>((chunks > 0 ? chunks : 1) * cols * outputs) * sizeof(double);
}
// dbias[m] += sum_n dout[n, m].
cudaError_t bias_backward(cudaStream_t stream, float* dbias, const float* dout, int64_t N, int M,
                          double* partials);
// dweight[c] += sum_n dout * xhat, dbias[c] += sum_n dout (xhat = (inp - mean) rstd).
cudaError_t layernorm_backward_params(cudaStream_t stream, float* dweight, float* dbias,
                                      const float* dout, const float* inp, const float* mean,
                                      const float* rstd, int64_t N, int C, double* partials);
// dweight[c] += sum over vectors of dy * x * rstd.
cudaError_t rmsnorm_backward_weight(cudaStream_t stream, float* dweight, const float* dy,
                                    int64_t ld_dy, ConstTypedPtr x, int64_t ld_x, const float* rstd,
                                    const RmsNormShape& shape, double* partials);

// --- whole-array sums in double ------------------------------------------------------------
// *result (device) = sum of data[i] (squares: sum of data[i]^2) in double: kSumBlocks
// blocks sum fixed grid-stride slices into `partials` (kSumBlocks doubles), then one
// thread adds those in order.
inline constexpr int kSumBlocks = 512;
cudaError_t sum(cudaStream_t stream, const float* data, int64_t n, bool squares, double* partials,
                double* result);

}  // namespace shardlm::cuda::kernels
