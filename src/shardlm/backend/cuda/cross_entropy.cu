// Row-wise cross-entropy (cross_entropy.cuh): a block per row, three passes over the
// row's V logits (max, sum of exponentials, gradient), each thread striding over the
// columns. Block reductions combine the threads in a fixed order (warp xor-butterfly,
// then warp 0..7 in order), so the results are the same from run to run. The gradient
// pass recomputes e^(l - max) rather than storing it: it reads the row a third time
// (from L2 for rows up to a few MiB) but needs no scratch.
#include "shardlm/backend/cuda/cross_entropy.cuh"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "shardlm/backend/cuda/kernel_launch.hpp"

namespace shardlm::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// The block-wide reduction of every thread's `value`, returned on every thread. Every
// thread of the block calls it; `scratch` is kRowWarps floats of shared memory.
template <typename Op>
__device__ __forceinline__ float block_reduce(float value, Op op, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = value;
  __syncthreads();
  float result = scratch[0];
#pragma unroll
  for (int w = 1; w < kRowWarps; ++w) result = op(result, scratch[w]);
  __syncthreads();  // scratch is written again by the next reduction
  return result;
}

// grid (rows), kRowThreads threads.
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_rows_kernel(float* logits, int64_t stride, const int32_t* targets, int V,
                              float grad_scale, float* losses, bool want_grad) {
  __shared__ float scratch[kRowWarps];
  const int64_t r = blockIdx.x;
  float* row = logits + r * stride;
  const int target = targets[r];
  if (target < 0 || target >= V) {  // ignored (or, >= V, a caller bug: NaN loss)
    if (threadIdx.x == 0) losses[r] = target < 0 ? 0.0f : NAN;
    if (want_grad)
      for (int j = threadIdx.x; j < V; j += kRowThreads) row[j] = 0.0f;
    return;
  }
  // Read before any thread overwrites the row (the writes follow two barriers).
  const float target_logit = row[target];

  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < V; j += kRowThreads) local_max = fmaxf(local_max, row[j]);
  const float row_max = block_reduce(local_max, MaxOp{}, scratch);

  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += kRowThreads) local_sum += expf(row[j] - row_max);
  const float sum = block_reduce(local_sum, SumOp{}, scratch);

  if (threadIdx.x == 0) losses[r] = row_max + logf(sum) - target_logit;
  if (!want_grad) return;
  // grad_scale * (softmax - onehot), written as the CPU does: e * (grad_scale / sum),
  // minus grad_scale at the target.
  const float factor = grad_scale / sum;
  for (int j = threadIdx.x; j < V; j += kRowThreads) {
    const float g = expf(row[j] - row_max) * factor;
    row[j] = j == target ? g - grad_scale : g;
  }
}

}  // namespace

void cross_entropy_rows(cudaStream_t stream, float* logits, int64_t stride,
                        const int32_t* targets, int64_t rows, int V, float grad_scale,
                        float* losses, bool want_grad) {
  if (V <= 0 || stride < V || rows < 0 || rows > std::numeric_limits<int32_t>::max())
    throw_kernel_argument_error("cuda cross_entropy_rows: bad arguments (rows " +
                                std::to_string(rows) + ", V " + std::to_string(V) +
                                ", stride " + std::to_string(stride) +
                                "); expected V > 0, stride >= V, 0 <= rows < 2^31");
  if (rows == 0) return;
  SHARDLM_LAUNCH_KERNEL("cross_entropy_rows_kernel", cross_entropy_rows_kernel,
                        dim3(static_cast<unsigned>(rows)), kRowThreads, stream, logits, stride,
                        targets, V, grad_scale, losses, want_grad);
}

}  // namespace shardlm::cuda
