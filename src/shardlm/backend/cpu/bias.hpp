// Bias and residual elementwise kernels around the GEMMs (y = x W + b).
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// out[n, :] += bias, for an [N, M] matrix.
void add_bias(float* out, const float* bias, int64_t N, int M);

// out = in + bias (per column), stored in out's type (rounded once): a GEMM's fp32
// result biased and stored as a compute-type activation in one pass. With fp32 out,
// in may be out.data (in place).
void add_bias(TypedPtr out, const float* in, const float* bias, int64_t N, int M);

// One row of residual_add_bias; also used by the fused residual + LayerNorm.
inline void residual_add_bias_row(float* out, const float* a, const float* branch,
                                  const float* bias, int M) {
  if (bias != nullptr) {
#pragma omp simd
    for (int m = 0; m < M; ++m) out[m] = a[m] + branch[m] + bias[m];
  } else {
#pragma omp simd
    for (int m = 0; m < M; ++m) out[m] = a[m] + branch[m];
  }
}

// out = a + branch + bias (bias per column, may be null): closes a residual block.
void residual_add_bias(float* out, const float* a, const float* branch, const float* bias,
                       int64_t N, int M);

// dbias += sum over rows of dout ([N, M]), reduced per column block in double so it
// does not depend on the thread count.
void bias_backward(float* dbias, const float* dout, int64_t N, int M);

}  // namespace shardlm::cpu
