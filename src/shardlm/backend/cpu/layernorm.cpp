#include "shardlm/backend/cpu/layernorm.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

// Normalizes one row that is already in `x`; writes out and returns (mean, rstd).
template <typename Writer>
inline void normalize_row(Writer out_row, float* mean_out, float* rstd_out, const float* x,
                          const float* weight, const float* bias, int C) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; ++c) sum += x[c];
  const float m = sum / static_cast<float>(C);
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int c = 0; c < C; ++c) {
    const float d = x[c] - m;
    sum_sq += d * d;
  }
  const float r = 1.0f / std::sqrt(sum_sq / static_cast<float>(C) + kLayerNormEps);
#pragma omp simd
  for (int c = 0; c < C; ++c) out_row(c, (x[c] - m) * r * weight[c] + bias[c]);
  *mean_out = m;
  *rstd_out = r;
}

}  // namespace

void layernorm_forward(TypedPtr out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int C) {
  const PhaseScope phase(Phase::norms_elementwise);
  with_writer(out, [&](auto writer) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      normalize_row(writer.at(n * C), mean + n, rstd + n, inp + n * C, weight, bias, C);
  });
}

void residual_layernorm_forward(float* residual, TypedPtr out, float* mean, float* rstd,
                                const float* a, const float* branch, const float* branch_bias,
                                const float* weight, const float* bias, int64_t N, int C) {
  const PhaseScope phase(Phase::norms_elementwise);
  with_writer(out, [&](auto writer) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* res_row = residual + n * C;
      residual_add_bias_row(res_row, a + n * C, branch + n * C, branch_bias, C);
      normalize_row(writer.at(n * C), mean + n, rstd + n, res_row, weight, bias, C);
    }
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int C) {
  const PhaseScope phase(Phase::norms_elementwise);
  constexpr int kColumnBlock = 64;
  const int num_blocks = (C + kColumnBlock - 1) / kColumnBlock;
  const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel
  {
    // Input gradient, row by row:
    // dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight.
#pragma omp for schedule(static) nowait
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float m = mean[n];
      const float r = rstd[n];
      float sum_g = 0.0f;
      float sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
      for (int c = 0; c < C; ++c) {
        const float g = dy[c] * weight[c];
        sum_g += g;
        sum_g_xhat += g * (x[c] - m) * r;
      }
      const float mean_g = sum_g * inv_c;
      const float mean_g_xhat = sum_g_xhat * inv_c;
      float* dx = dinp + n * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * r;
        dx[c] += r * (dy[c] * weight[c] - mean_g - xhat * mean_g_xhat);
      }
    }
    // Parameter gradients, column block by column block (reads disjoint from the
    // writes above, so no barrier is needed between the two loops).
#pragma omp for schedule(static)
    for (int block = 0; block < num_blocks; ++block) {
      const int c0 = block * kColumnBlock;
      const int width = std::min(C - c0, kColumnBlock);
      double dw_acc[kColumnBlock] = {};
      double db_acc[kColumnBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* x = inp + n * C + c0;
        const float* dy = dout + n * C + c0;
        const float m = mean[n];
        const float r = rstd[n];
#pragma omp simd
        for (int c = 0; c < width; ++c) {
          dw_acc[c] += static_cast<double>(dy[c] * ((x[c] - m) * r));
          db_acc[c] += static_cast<double>(dy[c]);
        }
      }
      for (int c = 0; c < width; ++c) {
        dweight[c0 + c] += static_cast<float>(dw_acc[c]);
        dbias[c0 + c] += static_cast<float>(db_acc[c]);
      }
    }
  }
}

}  // namespace shardlm::cpu
