// Mixture-of-experts kernels of the CUDA backend (the cpu:: contracts of
// backend/cpu/moe.hpp): gathering an expert's rows, the weighted scatter-add back, the
// top-k weights' gradients, the router's backward and the shared expert's gate.
// Deterministic without atomics: a scatter-add gives each thread one column and walks the
// rows in order (a token's contributions add in assignment order, as on the CPU); dot
// products run in one thread, in index order. Simple, not tuned.
#include "shardlm/backend/cuda/device_math.cuh"
#include "shardlm/backend/cuda/kernels.cuh"

namespace shardlm::cuda::kernels {

using namespace device;

namespace {

template <typename T>
__global__ void gather_rows_kernel(T* dst, const T* src, const int32_t* index, int64_t rows,
                                   int64_t width) {
  const int64_t n = rows * width;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const int64_t r = i / width, c = i - r * width;
    dst[i] = src[static_cast<int64_t>(index[r]) * width + c];
  }
}

__global__ void scatter_add_rows_kernel(float* out, const float* src, const int32_t* index,
                                        const float* weight, int64_t rows, int64_t width) {
  for (int64_t c = grid_first(); c < width; c += grid_stride())
    for (int64_t i = 0; i < rows; ++i) {
      float* y = out + static_cast<int64_t>(index[i]) * width + c;
      const float o = src[i * width + c];
      if (weight == nullptr)
        *y += o;
      else
        *y += weight[i] * o;
    }
}

__global__ void assignment_weights_kernel(float* weight, const float* top_weight,
                                          const int32_t* token, const int32_t* slot, int k,
                                          int64_t rows) {
  for (int64_t i = grid_first(); i < rows; i += grid_stride())
    weight[i] = top_weight[static_cast<int64_t>(token[i]) * k + slot[i]];
}

// The (token, slot) pairs of one call are distinct (one assignment each): no two
// threads write the same element.
__global__ void scatter_weight_grads_kernel(float* d_top_weight, const float* dot,
                                            const int32_t* token, const int32_t* slot, int k,
                                            int64_t rows) {
  for (int64_t i = grid_first(); i < rows; i += grid_stride())
    d_top_weight[static_cast<int64_t>(token[i]) * k + slot[i]] += dot[i];
}

__global__ void weight_backward_kernel(float* dot, float* g, const float* act, int64_t I,
                                       float* dy, int64_t C, const float* weight, int64_t rows) {
  for (int64_t i = grid_first(); i < rows; i += grid_stride()) {
    float d = 0;
    for (int64_t j = 0; j < I; ++j) d += g[i * I + j] * act[i * I + j];
    dot[i] = d;
    const float w = weight[i];
    for (int64_t j = 0; j < I; ++j) g[i * I + j] *= w;
    for (int64_t j = 0; j < C; ++j) dy[i * C + j] *= w;
  }
}

// One thread per token; the row of dlogits holds the probabilities' gradient first.
__global__ void router_backward_kernel(float* dlogits, const float* probs,
                                       const int32_t* top_expert, const float* d_top_weight,
                                       const float* aux_dprob, int64_t n, int E, int k,
                                       bool norm_topk_prob) {
  for (int64_t t = grid_first(); t < n; t += grid_stride()) {
    const float* p = probs + t * E;
    const int32_t* top = top_expert + t * k;
    const float* dw = d_top_weight + t * k;
    float* dp = dlogits + t * E;
    for (int e = 0; e < E; ++e) dp[e] = aux_dprob != nullptr ? aux_dprob[e] : 0.0f;
    if (norm_topk_prob) {
      float S = 0, dot = 0;
      for (int j = 0; j < k; ++j) {
        S += p[top[j]];
        dot += dw[j] * p[top[j]];
      }
      for (int j = 0; j < k; ++j) dp[top[j]] += dw[j] / S - dot / (S * S);
    } else {
      for (int j = 0; j < k; ++j) dp[top[j]] += dw[j];
    }
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot);
  }
}

__global__ void sigmoid_kernel(float* gate, int64_t n) {
  for (int64_t t = grid_first(); t < n; t += grid_stride()) gate[t] = 1.0f / (1.0f + expf(-gate[t]));
}

__global__ void gated_add_kernel(float* y, const float* gate, const float* out, int64_t n,
                                 int64_t C) {
  const int64_t total = n * C;
  for (int64_t i = grid_first(); i < total; i += grid_stride()) y[i] += gate[i / C] * out[i];
}

__global__ void shared_gate_backward_kernel(float* dz, float* ds, const float* dy,
                                            const float* gate, const float* out, int64_t n,
                                            int64_t C) {
  for (int64_t t = grid_first(); t < n; t += grid_stride()) {
    const float g = gate[t];
    float dot = 0.0f;
    for (int64_t j = 0; j < C; ++j) dot += dy[t * C + j] * out[t * C + j];
    dz[t] = dot * g * (1.0f - g);
    for (int64_t j = 0; j < C; ++j) ds[t * C + j] = g * dy[t * C + j];
  }
}

}  // namespace

cudaError_t gather_rows(cudaStream_t stream, TypedPtr dst, ConstTypedPtr src, const int32_t* index,
                        int64_t rows, int64_t width) {
  if (rows <= 0 || width <= 0) return cudaGetLastError();
  if (src.dtype == DType::fp32) {
    SHARDLM_KERNEL(gather_rows_kernel<uint32_t>, grid_blocks(rows * width), kGridThreads, stream,
                   static_cast<uint32_t*>(dst.data), static_cast<const uint32_t*>(src.data), index,
                   rows, width);
  } else {
    SHARDLM_KERNEL(gather_rows_kernel<uint16_t>, grid_blocks(rows * width), kGridThreads, stream,
                   static_cast<uint16_t*>(dst.data), static_cast<const uint16_t*>(src.data), index,
                   rows, width);
  }
  return cudaGetLastError();
}

cudaError_t scatter_add_rows(cudaStream_t stream, float* out, const float* src,
                             const int32_t* index, const float* weight, int64_t rows,
                             int64_t width) {
  if (rows <= 0 || width <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(scatter_add_rows_kernel, grid_blocks(width), kGridThreads, stream, out, src, index,
                 weight, rows, width);
  return cudaGetLastError();
}

cudaError_t moe_assignment_weights(cudaStream_t stream, float* weight, const float* top_weight,
                                   const int32_t* token, const int32_t* slot, int k, int64_t rows) {
  if (rows <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(assignment_weights_kernel, grid_blocks(rows), kGridThreads, stream, weight,
                 top_weight, token, slot, k, rows);
  return cudaGetLastError();
}

cudaError_t moe_scatter_weight_grads(cudaStream_t stream, float* d_top_weight, const float* dot,
                                     const int32_t* token, const int32_t* slot, int k,
                                     int64_t rows) {
  if (rows <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(scatter_weight_grads_kernel, grid_blocks(rows), kGridThreads, stream, d_top_weight,
                 dot, token, slot, k, rows);
  return cudaGetLastError();
}

cudaError_t moe_weight_backward(cudaStream_t stream, float* dot, float* g, const float* act,
                                int64_t I, float* dy, int64_t C, const float* weight,
                                int64_t rows) {
  if (rows <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(weight_backward_kernel, grid_blocks(rows), kGridThreads, stream, dot, g, act, I, dy,
                 C, weight, rows);
  return cudaGetLastError();
}

cudaError_t moe_router_backward(cudaStream_t stream, float* dlogits, const float* probs,
                                const int32_t* top_expert, const float* d_top_weight,
                                const float* aux_dprob, int64_t n, int E, int k,
                                bool norm_topk_prob) {
  if (n <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(router_backward_kernel, grid_blocks(n), kGridThreads, stream, dlogits, probs,
                 top_expert, d_top_weight, aux_dprob, n, E, k, norm_topk_prob);
  return cudaGetLastError();
}

cudaError_t shared_expert_gate_forward(cudaStream_t stream, float* gate, float* y, const float* out,
                                       int64_t n, int64_t C) {
  if (n <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(sigmoid_kernel, grid_blocks(n), kGridThreads, stream, gate, n);
  if (y != nullptr && C > 0)
    SHARDLM_KERNEL(gated_add_kernel, grid_blocks(n * C), kGridThreads, stream, y, gate, out, n, C);
  return cudaGetLastError();
}

cudaError_t shared_expert_gate_backward(cudaStream_t stream, float* dz, float* ds, const float* dy,
                                        const float* gate, const float* out, int64_t n,
                                        int64_t C) {
  if (n <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(shared_gate_backward_kernel, grid_blocks(n), kGridThreads, stream, dz, ds, dy, gate,
                 out, n, C);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda::kernels
