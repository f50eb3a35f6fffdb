#include "shardlm/backend/cpu/gelu.hpp"

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in, const float* bias,
                       int64_t N, int M) {
  const PhaseScope phase(Phase::norms_elementwise);
  with_writer(out, [&](auto out_writer) {
    with_writer(pre_out, [&](auto pre_writer) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float* in_row = pre_in + n * M;
        const auto pre_row = pre_writer.at(n * M);
        const auto out_row = out_writer.at(n * M);
#pragma omp simd
        for (int m = 0; m < M; ++m) {
          const float x =
              decltype(pre_writer)::round(bias != nullptr ? in_row[m] + bias[m] : in_row[m]);
          pre_row(m, x);
          const float t = tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
          out_row(m, 0.5f * x * (1.0f + t));
        }
      }
    });
  });
}

void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre, int64_t count) {
  const PhaseScope phase(Phase::norms_elementwise);
  constexpr int64_t kGrain = 4096;
  const int64_t num_chunks = (count + kGrain - 1) / kGrain;
  with_reader(pre, [&](auto read_pre) {
#pragma omp parallel for schedule(static)
    for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
      const int64_t begin = chunk * kGrain;
      const int64_t end = begin + kGrain < count ? begin + kGrain : count;
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) {
        const float x = read_pre(i);
        const float t = tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
        const float sech2 = 1.0f - t * t;
        const float grad =
            0.5f * (1.0f + t) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
        dinp[i] = dout[i] * grad;
      }
    }
  });
}

}  // namespace shardlm::cpu
