#include "shardlm/backend/cpu/bias.hpp"

#include <algorithm>

#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

void add_bias(float* out, const float* bias, int64_t N, int M) {
  const PhaseScope phase(Phase::norms_elementwise);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = out + n * M;
#pragma omp simd
    for (int m = 0; m < M; ++m) row[m] += bias[m];
  }
}

void add_bias(TypedPtr out, const float* in, const float* bias, int64_t N, int M) {
  const PhaseScope phase(Phase::norms_elementwise);
  with_writer(out, [&](auto writer) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* row = in + n * M;
      const auto out_row = writer.at(n * M);
#pragma omp simd
      for (int m = 0; m < M; ++m) out_row(m, row[m] + bias[m]);
    }
  });
}

void residual_add_bias(float* out, const float* a, const float* branch, const float* bias,
                       int64_t N, int M) {
  const PhaseScope phase(Phase::norms_elementwise);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    residual_add_bias_row(out + n * M, a + n * M, branch + n * M, bias, M);
}

void bias_backward(float* dbias, const float* dout, int64_t N, int M) {
  const PhaseScope phase(Phase::norms_elementwise);
  constexpr int kColumnBlock = 64;
  const int num_blocks = (M + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int block = 0; block < num_blocks; ++block) {
    const int m0 = block * kColumnBlock;
    const int width = std::min(M - m0, kColumnBlock);
    double acc[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = dout + n * M + m0;
#pragma omp simd
      for (int m = 0; m < width; ++m) acc[m] += static_cast<double>(row[m]);
    }
    for (int m = 0; m < width; ++m) dbias[m0 + m] += static_cast<float>(acc[m]);
  }
}

}  // namespace shardlm::cpu
