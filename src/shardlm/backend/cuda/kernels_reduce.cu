// Kernels of the CUDA backend that reduce: LayerNorm and RMSNorm (one warp per
// normalized vector, sums by warp butterflies), parameter gradients as deterministic
// column sums, the embedding's scatter-add, whole-array sums in double, and the
// vocabulary-parallel softmax's row maxima and sums (a warp per row).
//
// No atomics anywhere: every sum has an order fixed by the shapes alone, so a run
// repeats bit for bit on the same GPU (the project's reproducibility promise).
#include "shardlm/backend/cuda/device_math.cuh"
#include "shardlm/backend/cuda/kernels.cuh"

namespace shardlm::cuda::kernels {

using namespace device;

namespace {

// Norms: a warp per vector. Hidden sizes (768..8192) give each lane 24..256 values, the
// per-head norms (head_dim 64..128) 2..4; a vector's statistics need no shared memory
// and no block barrier, and blocks of 8 warps keep the SMs full.
constexpr int kWarpsPerBlock = 8;
constexpr int kNormThreads = kWarpsPerBlock * 32;

int norm_blocks(int64_t vectors) {
  return static_cast<int>((vectors + kWarpsPerBlock - 1) / kWarpsPerBlock);
}
__device__ __forceinline__ int64_t warp_vector() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// LayerNorm of one row per warp; with `residual` set, the row is first
// residual = a + branch (+ branch_bias), written by the lane that later reads it.
template <typename Out>
__global__ void layernorm_forward_kernel(typename Out::Storage* out, float* mean, float* rstd,
                                         float* residual, const float* inp_or_a,
                                         const float* branch, const float* branch_bias,
                                         const float* weight, const float* bias, int64_t N, int C,
                                         float eps) {
  // A warp past the last vector reads and writes nothing but still takes part in the
  // shuffles, so every warp of a block reaches the same synchronisation points (the
  // emulation checks that; on a GPU only a warp's own lanes would have to).
  const bool active = warp_vector() < N;
  const int64_t row = active ? warp_vector() : 0;
  const int width = active ? C : 0;
  const int lane = lane_id();
  const float* x = inp_or_a + row * C;
  if (residual != nullptr) {
    float* res = residual + row * C;
    const float* b = branch + row * C;
    for (int c = lane; c < width; c += 32)
      res[c] = branch_bias != nullptr ? x[c] + b[c] + branch_bias[c] : x[c] + b[c];
    x = res;
  }
  float sum = 0.0f;
  for (int c = lane; c < width; c += 32) sum += x[c];
  const float m = warp_sum(sum) / static_cast<float>(C);
  float sum_sq = 0.0f;
  for (int c = lane; c < width; c += 32) {
    const float d = x[c] - m;
    sum_sq += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(sum_sq) / static_cast<float>(C) + eps);
  for (int c = lane; c < width; c += 32)
    Out::store(out, row * C + c, (x[c] - m) * r * weight[c] + bias[c]);
  if (active && lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp += rstd (g - mean(g) - xhat mean(g xhat)), g = dout * weight.
__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean,
                                                const float* rstd, int64_t N, int C) {
  // A warp past the last vector reads and writes nothing but still takes part in the
  // shuffles, so every warp of a block reaches the same synchronisation points (the
  // emulation checks that; on a GPU only a warp's own lanes would have to).
  const bool active = warp_vector() < N;
  const int64_t row = active ? warp_vector() : 0;
  const int width = active ? C : 0;
  const int lane = lane_id();
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int c = lane; c < width; c += 32) {
    const float g = dy[c] * weight[c];
    sum_g += g;
    sum_g_xhat += g * (x[c] - m) * r;
  }
  const float inv_c = 1.0f / static_cast<float>(C);
  const float mean_g = warp_sum(sum_g) * inv_c;
  const float mean_g_xhat = warp_sum(sum_g_xhat) * inv_c;
  float* dx = dinp + row * C;
  for (int c = lane; c < width; c += 32) {
    const float xhat = (x[c] - m) * r;
    dx[c] += r * (dy[c] * weight[c] - mean_g - xhat * mean_g_xhat);
  }
}

// Offset of vector v (row v / heads, head v % heads) in a tensor with row stride ld.
__device__ __forceinline__ int64_t vector_offset(int64_t v, int heads, int dim, int64_t ld) {
  const int64_t row = v / heads;
  return row * ld + (v - row * heads) * dim;
}

// RMSNorm of one vector per warp. y may be x's storage (fp32): each lane reads its
// values before it writes them.
template <typename Y, typename X>
__global__ void rmsnorm_forward_kernel(typename Y::Storage* y, int64_t ld_y, float* rstd,
                                       const typename X::Storage* x, int64_t ld_x,
                                       const float* weight, int64_t vectors, int heads, int dim,
                                       float eps) {
  // A warp past the last vector reads and writes nothing but still takes part in the
  // shuffles, so every warp of a block reaches the same synchronisation points (the
  // emulation checks that; on a GPU only a warp's own lanes would have to).
  const bool active = warp_vector() < vectors;
  const int64_t v = active ? warp_vector() : 0;
  const int width = active ? dim : 0;
  const int lane = lane_id();
  const int64_t x_at = vector_offset(v, heads, dim, ld_x);
  const int64_t y_at = vector_offset(v, heads, dim, ld_y);
  float sum_sq = 0.0f;
  for (int c = lane; c < width; c += 32) {
    const float value = X::load(x, x_at + c);
    sum_sq += value * value;
  }
  const float r = 1.0f / sqrtf(warp_sum(sum_sq) / static_cast<float>(dim) + eps);
  for (int c = lane; c < width; c += 32)
    Y::store(y, y_at + c, X::load(x, x_at + c) * r * weight[c]);
  if (active && lane == 0) rstd[v] = r;
}

template <typename Y>
__global__ void residual_rmsnorm_forward_kernel(float* residual, typename Y::Storage* y,
                                                float* rstd, const float* a, const float* branch,
                                                const float* branch_bias, const float* weight,
                                                int64_t N, int C, float eps) {
  // A warp past the last vector reads and writes nothing but still takes part in the
  // shuffles, so every warp of a block reaches the same synchronisation points (the
  // emulation checks that; on a GPU only a warp's own lanes would have to).
  const bool active = warp_vector() < N;
  const int64_t row = active ? warp_vector() : 0;
  const int width = active ? C : 0;
  const int lane = lane_id();
  float* res = residual + row * C;
  float sum_sq = 0.0f;
  for (int c = lane; c < width; c += 32) {
    const int64_t at = row * C + c;
    const float value =
        branch_bias != nullptr ? a[at] + branch[at] + branch_bias[c] : a[at] + branch[at];
    res[c] = value;
    sum_sq += value * value;
  }
  const float r = 1.0f / sqrtf(warp_sum(sum_sq) / static_cast<float>(C) + eps);
  for (int c = lane; c < width; c += 32) Y::store(y, row * C + c, res[c] * r * weight[c]);
  if (active && lane == 0) rstd[row] = r;
}

// dx = r g w - x r^3 mean(g w x), written or added.
template <typename X>
__global__ void rmsnorm_backward_input_kernel(float* dx, int64_t ld_dx, const float* dy,
                                              int64_t ld_dy, const typename X::Storage* x,
                                              int64_t ld_x, const float* weight, const float* rstd,
                                              int64_t vectors, int heads, int dim,
                                              bool accumulate_dx) {
  // A warp past the last vector reads and writes nothing but still takes part in the
  // shuffles, so every warp of a block reaches the same synchronisation points (the
  // emulation checks that; on a GPU only a warp's own lanes would have to).
  const bool active = warp_vector() < vectors;
  const int64_t v = active ? warp_vector() : 0;
  const int width = active ? dim : 0;
  const int lane = lane_id();
  const int64_t x_at = vector_offset(v, heads, dim, ld_x);
  const float* g = dy + vector_offset(v, heads, dim, ld_dy);
  float* out = dx + vector_offset(v, heads, dim, ld_dx);
  const float r = rstd[v];
  float sum_gx = 0.0f;
  for (int c = lane; c < width; c += 32) sum_gx += g[c] * weight[c] * X::load(x, x_at + c);
  const float k = r * r * r * warp_sum(sum_gx) * (1.0f / static_cast<float>(dim));
  for (int c = lane; c < width; c += 32) {
    const float value = r * g[c] * weight[c] - k * X::load(x, x_at + c);
    out[c] = accumulate_dx ? out[c] + value : value;
  }
}

// --- column sums ---------------------------------------------------------------------------------

// A block (8 warps) sums a 32-column tile over one chunk of kColumnSumChunkRows rows:
// lane tx of warp ty takes column tx and rows ty, ty + 8, ...; the 8 row lanes are then
// added in lane order. A warp reads 32 consecutive columns of a row (coalesced).
constexpr int kTileColumns = 32;
constexpr int kRowLanes = 8;
constexpr int kColumnSumThreads = kTileColumns * kRowLanes;

template <int K, typename Term>
__global__ void column_partials_kernel(double* partials, int64_t rows, int cols, int64_t chunks,
                                       Term term) {
  __shared__ double lanes[K][kRowLanes][kTileColumns];
  const int tx = static_cast<int>(threadIdx.x % kTileColumns);
  const int ty = static_cast<int>(threadIdx.x / kTileColumns);
  const int c = static_cast<int>(blockIdx.x) * kTileColumns + tx;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    double acc[K];
    for (int k = 0; k < K; ++k) acc[k] = 0.0;
    const int64_t r0 = chunk * kColumnSumChunkRows;
    const int64_t r1 = r0 + kColumnSumChunkRows < rows ? r0 + kColumnSumChunkRows : rows;
    if (c < cols)
      for (int64_t r = r0 + ty; r < r1; r += kRowLanes) term(r, c, acc);
    for (int k = 0; k < K; ++k) lanes[k][ty][tx] = acc[k];
    __syncthreads();
    if (ty == 0 && c < cols) {
      for (int k = 0; k < K; ++k) {
        double total = 0.0;
        for (int y = 0; y < kRowLanes; ++y) total += lanes[k][y][tx];
        partials[(chunk * K + k) * cols + c] = total;
      }
    }
    __syncthreads();  // the lanes are reused by the next chunk
  }
}

// out_k[c] += the chunks' partial sums, added in chunk order.
template <int K>
__global__ void column_totals_kernel(float* out0, float* out1, const double* partials,
                                     int64_t chunks, int cols) {
  for (int64_t c = grid_first(); c < cols; c += grid_stride()) {
    for (int k = 0; k < K; ++k) {
      double total = 0.0;
      for (int64_t chunk = 0; chunk < chunks; ++chunk)
        total += partials[(chunk * K + k) * cols + c];
      float* out = k == 0 ? out0 : out1;
      out[c] += static_cast<float>(total);
    }
  }
}

template <int K, typename Term>
cudaError_t column_sums(cudaStream_t stream, float* out0, float* out1, int64_t rows, int cols,
                        Term term, double* partials) {
  if (rows <= 0 || cols <= 0) return cudaGetLastError();
  const int64_t chunks = (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
  const dim3 grid((cols + kTileColumns - 1) / kTileColumns,
                  static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
  const auto partials_kernel = &column_partials_kernel<K, Term>;
  SHARDLM_KERNEL(partials_kernel, grid, kColumnSumThreads, stream, partials, rows, cols, chunks,
                 term);
  const int total_blocks = (cols + 255) / 256;
  const auto totals_kernel = &column_totals_kernel<K>;
  SHARDLM_KERNEL(totals_kernel, total_blocks, 256, stream, out0, out1, partials, chunks, cols);
  return cudaGetLastError();
}

struct BiasTerm {
  const float* dout;
  int M;
  __device__ void operator()(int64_t r, int c, double* acc) const {
    acc[0] += static_cast<double>(dout[r * M + c]);
  }
};

// The CPU's products: dy * xhat in fp32, then widened.
struct LayerNormTerm {
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ void operator()(int64_t r, int c, double* acc) const {
    const float dy = dout[r * C + c];
    acc[0] += static_cast<double>(dy * ((inp[r * C + c] - mean[r]) * rstd[r]));
    acc[1] += static_cast<double>(dy);
  }
};

template <typename X>
struct RmsNormWeightTerm {
  const float* dy;
  int64_t ld_dy;
  const typename X::Storage* x;
  int64_t ld_x;
  const float* rstd;
  int heads, dim;
  __device__ void operator()(int64_t v, int c, double* acc) const {
    const double g = dy[vector_offset(v, heads, dim, ld_dy) + c];
    const double xv = X::load(x, vector_offset(v, heads, dim, ld_x) + c);
    acc[0] += g * xv * static_cast<double>(rstd[v]);
  }
};

// --- embedding backward
// ---------------------------------------------------------------------------

// The rows of dwte (and of dwpe for packed positions) that the batch touches, each
// summed in batch order: a stable order of the batch's rows by token id, then a thread
// per (distinct token, column) that starts from the row's value and adds that token's
// rows of dout in the order they come in the batch. These are the CPU's additions in the
// CPU's order (cpu::embedding_backward: a column's owner adds the rows in token order),
// so the result is the CPU's bit for bit, with no atomics; the parallelism is distinct
// tokens x columns (thousands x 768 for a GPT-2 batch) instead of the columns alone,
// whose sequential walk over all B x T rows cost ~15-25 ms a step.

constexpr int kRankThreads = 256;
constexpr int kRowColumns = 256;

// order[rank(n)] = n for n < N, with rank(n) = #{m : key[m] < key[n]} +
// #{m < n : key[m] == key[n]}: a stable counting sort, each rank found by one thread
// comparing its key with all N (in shared-memory tiles). O(N^2) comparisons, which a
// GPU does at ~10^13 a second: 2.7e8 for a 16 x 1024 batch.
__global__ void stable_order_kernel(int32_t* order, const int32_t* keys, int64_t N) {
  __shared__ int32_t tile[kRankThreads];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRankThreads + threadIdx.x;
  const int32_t key = n < N ? keys[n] : 0;
  int64_t rank = 0;
  for (int64_t m0 = 0; m0 < N; m0 += kRankThreads) {
    __syncthreads();  // the previous tile's readers are done
    const int64_t m = m0 + threadIdx.x;
    tile[threadIdx.x] = m < N ? keys[m] : 0;
    __syncthreads();
    const int64_t count = N - m0 < kRankThreads ? N - m0 : kRankThreads;
    for (int t = 0; t < count; ++t) {
      const int32_t other = tile[t];
      rank += (other < key || (other == key && m0 + t < n)) ? 1 : 0;
    }
  }
  if (n < N) order[rank] = static_cast<int32_t>(n);
}

// grid (N, column blocks): block r adds the run of equal keys that starts at sorted
// position r (nothing when position r - 1 holds the same key) into grad's row of that key.
__global__ void embedding_rows_in_order_kernel(float* grad, const float* dout,
                                               const int32_t* keys, const int32_t* order,
                                               int64_t N, int C) {
  const int64_t r = blockIdx.x;
  const int c = static_cast<int>(blockIdx.y) * kRowColumns + static_cast<int>(threadIdx.x);
  const int32_t key = keys[order[r]];
  if (c >= C || (r > 0 && keys[order[r - 1]] == key)) return;
  float* row = grad + static_cast<int64_t>(key) * C;
  float g = row[c];
  for (int64_t k = r; k < N && keys[order[k]] == key; ++k)
    g += dout[static_cast<int64_t>(order[k]) * C + c];
  row[c] = g;
}

// Position t = 0..T-1 of every sequence: element (t, c) sums its B rows in order.
__global__ void embedding_backward_positions_kernel(float* dwpe, const float* dout, int B, int T,
                                                    int C) {
  const int64_t total = static_cast<int64_t>(T) * C;
  for (int64_t idx = grid_first(); idx < total; idx += grid_stride()) {
    const int64_t t = idx / C, c = idx - t * C;
    float g = dwpe[idx];
    for (int b = 0; b < B; ++b) g += dout[(static_cast<int64_t>(b) * T + t) * C + c];
    dwpe[idx] = g;
  }
}

// --- whole-array sums
// ------------------------------------------------------------------------------

constexpr int kSumThreads = 256;

// Each thread sums a fixed grid-stride slice; the block's threads are then added by a
// shared-memory tree (fixed pairs), so the order depends on n and nothing else.
__global__ void sum_partials_kernel(const float* data, int64_t n, bool squares, double* partials) {
  __shared__ double thread_totals[kSumThreads];
  double acc = 0.0;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const double x = data[i];
    acc += squares ? x * x : x;
  }
  thread_totals[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half)
      thread_totals[threadIdx.x] += thread_totals[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = thread_totals[0];
}

// One thread adds the blocks' sums in block order (a warp is launched: blocks are
// whole warps, here and in the emulation).
__global__ void sum_final_kernel(const double* partials, int count, double* result) {
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int i = 0; i < count; ++i) total += partials[i];
  *result = total;
}

// --- the vocabulary-parallel softmax's row statistics: a warp per row ----------------------

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__global__ void vocab_shard_row_max_kernel(float* row_max, const float* logits, int64_t ld,
                                           int rows, VocabShardRows shard) {
  const bool active = warp_vector() < rows;  // (an idle warp still shuffles, see above)
  const int64_t r = active ? warp_vector() : 0;
  const int width = active ? shard.real : 0;
  const float* row = logits + r * ld;
  float m = -INFINITY;
  for (int j = lane_id(); j < width; j += 32) m = fmaxf(m, row[j]);
  m = warp_max(m);
  if (active && lane_id() == 0) row_max[r] = m;
}

// Each lane reads and overwrites only its own columns; the lane holding the target's
// column contributes its logit, every other lane 0, to a second warp sum (exact).
__global__ void vocab_shard_softmax_sums_kernel(float* sums, float* logits, int64_t ld,
                                                const float* row_max, const int32_t* targets,
                                                int rows, VocabShardRows shard) {
  const bool active = warp_vector() < rows;
  const int64_t r = active ? warp_vector() : 0;
  const int width = active ? shard.real : 0;
  float* row = logits + r * ld;
  const int32_t t = active ? targets[r] : -1;
  const int64_t target_column = vocab_shard_holds(shard, t) ? t - shard.begin : -1;
  const float m = active ? row_max[r] : 0.0f;
  float sum = 0.0f, target_logit = 0.0f;
  for (int j = lane_id(); j < width; j += 32) {
    const float l = row[j];
    if (j == target_column) target_logit = l;
    const float e = exp_approx(l - m);
    row[j] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  target_logit = warp_sum(target_logit);
  if (active && lane_id() == 0) {
    sums[2 * r] = sum;
    sums[2 * r + 1] = target_logit;
  }
}

}  // namespace

// --- launchers
// -------------------------------------------------------------------------------------

cudaError_t layernorm_forward(cudaStream_t stream, TypedPtr out, float* mean, float* rstd,
                              float* residual, const float* inp_or_a, const float* branch,
                              const float* branch_bias, const float* weight, const float* bias,
                              int64_t N, int C, float eps) {
  if (N <= 0) return cudaGetLastError();
  with_type(out.dtype, [&](auto o) {
    using O = decltype(o);
    const auto kernel = &layernorm_forward_kernel<O>;
    SHARDLM_KERNEL(kernel, norm_blocks(N), kNormThreads, stream,
                   static_cast<typename O::Storage*>(out.data), mean, rstd, residual, inp_or_a,
                   branch, branch_bias, weight, bias, N, C, eps);
  });
  return cudaGetLastError();
}

cudaError_t layernorm_backward_input(cudaStream_t stream, float* dinp, const float* dout,
                                     const float* inp, const float* weight, const float* mean,
                                     const float* rstd, int64_t N, int C) {
  if (N <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(layernorm_backward_input_kernel, norm_blocks(N), kNormThreads, stream, dinp, dout,
                 inp, weight, mean, rstd, N, C);
  return cudaGetLastError();
}

cudaError_t rmsnorm_forward(cudaStream_t stream, TypedPtr y, int64_t ld_y, float* rstd,
                            ConstTypedPtr x, int64_t ld_x, const float* weight,
                            const RmsNormShape& shape, float eps) {
  const int64_t vectors = shape.rows * shape.heads;
  if (vectors <= 0) return cudaGetLastError();
  with_type(y.dtype, [&](auto yt) {
    with_type(x.dtype, [&](auto xt) {
      using Y = decltype(yt);
      using X = decltype(xt);
      const auto kernel = &rmsnorm_forward_kernel<Y, X>;
      SHARDLM_KERNEL(kernel, norm_blocks(vectors), kNormThreads, stream,
                     static_cast<typename Y::Storage*>(y.data), ld_y, rstd,
                     static_cast<const typename X::Storage*>(x.data), ld_x, weight, vectors,
                     shape.heads, shape.dim, eps);
    });
  });
  return cudaGetLastError();
}

cudaError_t residual_rmsnorm_forward(cudaStream_t stream, float* residual, TypedPtr y, float* rstd,
                                     const float* a, const float* branch, const float* branch_bias,
                                     const float* weight, int64_t N, int C, float eps) {
  if (N <= 0) return cudaGetLastError();
  with_type(y.dtype, [&](auto yt) {
    using Y = decltype(yt);
    const auto kernel = &residual_rmsnorm_forward_kernel<Y>;
    SHARDLM_KERNEL(kernel, norm_blocks(N), kNormThreads, stream, residual,
                   static_cast<typename Y::Storage*>(y.data), rstd, a, branch, branch_bias, weight,
                   N, C, eps);
  });
  return cudaGetLastError();
}

cudaError_t rmsnorm_backward_input(cudaStream_t stream, float* dx, int64_t ld_dx, const float* dy,
                                   int64_t ld_dy, ConstTypedPtr x, int64_t ld_x,
                                   const float* weight, const float* rstd,
                                   const RmsNormShape& shape, bool accumulate_dx) {
  const int64_t vectors = shape.rows * shape.heads;
  if (vectors <= 0) return cudaGetLastError();
  with_type(x.dtype, [&](auto xt) {
    using X = decltype(xt);
    const auto kernel = &rmsnorm_backward_input_kernel<X>;
    SHARDLM_KERNEL(kernel, norm_blocks(vectors), kNormThreads, stream, dx, ld_dx, dy, ld_dy,
                   static_cast<const typename X::Storage*>(x.data), ld_x, weight, rstd, vectors,
                   shape.heads, shape.dim, accumulate_dx);
  });
  return cudaGetLastError();
}

cudaError_t bias_backward(cudaStream_t stream, float* dbias, const float* dout, int64_t N, int M,
                          double* partials) {
  return column_sums<1>(stream, dbias, nullptr, N, M, BiasTerm{dout, M}, partials);
}

cudaError_t layernorm_backward_params(cudaStream_t stream, float* dweight, float* dbias,
                                      const float* dout, const float* inp, const float* mean,
                                      const float* rstd, int64_t N, int C, double* partials) {
  return column_sums<2>(stream, dweight, dbias, N, C, LayerNormTerm{dout, inp, mean, rstd, C},
                        partials);
}

cudaError_t rmsnorm_backward_weight(cudaStream_t stream, float* dweight, const float* dy,
                                    int64_t ld_dy, ConstTypedPtr x, int64_t ld_x, const float* rstd,
                                    const RmsNormShape& shape, double* partials) {
  cudaError_t status = cudaSuccess;
  with_type(x.dtype, [&](auto xt) {
    using X = decltype(xt);
    const RmsNormWeightTerm<X> term{
        dy,          ld_dy,    static_cast<const typename X::Storage*>(x.data), ld_x, rstd,
        shape.heads, shape.dim};
    status = column_sums<1>(stream, dweight, nullptr, shape.rows * shape.heads, shape.dim, term,
                            partials);
  });
  return status;
}

cudaError_t embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const float* dout,
                               const int32_t* tokens, int B, int T, int C,
                               const int32_t* positions, int32_t* order_scratch) {
  const int64_t N = static_cast<int64_t>(B) * T;
  if (N <= 0 || C <= 0) return cudaGetLastError();
  const dim3 rows(static_cast<unsigned>(N), static_cast<unsigned>((C + kRowColumns - 1) / kRowColumns));
  const int rank_blocks = static_cast<int>((N + kRankThreads - 1) / kRankThreads);
  SHARDLM_KERNEL(stable_order_kernel, rank_blocks, kRankThreads, stream, order_scratch, tokens, N);
  SHARDLM_KERNEL(embedding_rows_in_order_kernel, rows, kRowColumns, stream, dwte, dout, tokens,
                 order_scratch, N, C);
  if (dwpe != nullptr && positions != nullptr) {  // packed positions repeat like tokens
    int32_t* position_order = order_scratch + N;
    SHARDLM_KERNEL(stable_order_kernel, rank_blocks, kRankThreads, stream, position_order,
                   positions, N);
    SHARDLM_KERNEL(embedding_rows_in_order_kernel, rows, kRowColumns, stream, dwpe, dout,
                   positions, position_order, N, C);
  }
  if (dwpe != nullptr && positions == nullptr) {
    const int64_t total = static_cast<int64_t>(T) * C;
    const int64_t needed = (total + 255) / 256;
    const int blocks = static_cast<int>(needed < 4096 ? needed : 4096);
    SHARDLM_KERNEL(embedding_backward_positions_kernel, blocks, 256, stream, dwpe, dout, B, T, C);
  }
  return cudaGetLastError();
}

cudaError_t sum(cudaStream_t stream, const float* data, int64_t n, bool squares, double* partials,
                double* result) {
  // A fixed grid (kSumBlocks x kSumThreads, whatever n is) fixes the summation order.
  SHARDLM_KERNEL(sum_partials_kernel, kSumBlocks, kSumThreads, stream, data, n, squares, partials);
  SHARDLM_KERNEL(sum_final_kernel, 1, 32, stream, partials, kSumBlocks, result);
  return cudaGetLastError();
}

cudaError_t vocab_shard_row_max(cudaStream_t stream, float* row_max, const float* logits,
                                int64_t ld, int rows, VocabShardRows shard) {
  if (rows <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(vocab_shard_row_max_kernel, norm_blocks(rows), kNormThreads, stream, row_max,
                 logits, ld, rows, shard);
  return cudaGetLastError();
}

cudaError_t vocab_shard_softmax_sums(cudaStream_t stream, float* sums, float* logits, int64_t ld,
                                     const float* row_max, const int32_t* targets, int rows,
                                     VocabShardRows shard) {
  if (rows <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(vocab_shard_softmax_sums_kernel, norm_blocks(rows), kNormThreads, stream, sums,
                 logits, ld, row_max, targets, rows, shard);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda::kernels
