#include "shardlm/backend/cpu/gelu.hpp"

#include <cmath>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/vector_math.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// tanh_approx (fast_math.hpp) on a float or a native vector of floats, the same
// operations: rows run a vector at a time and their tails element by element (in an
// `omp simd` loop GCC 12 left exp_approx's clamps, and so GELU, scalar).
inline float tanh_of(float x) { return tanh_approx(x); }
inline NativeFloats tanh_of(NativeFloats x) {
  const NativeFloats magnitude = x < 0.0f ? -x : x;  // fabs (-0 gives e = 1 either way)
  const NativeFloats e = exp_approx_native(-2.0f * magnitude);
  const NativeFloats t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

template <typename T>
inline T gelu(T x) {
  const T t = tanh_of(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

template <typename T>
inline T gelu_derivative(T x) {
  const T t = tanh_of(kSqrt2OverPi * (x + kCubic * x * x * x));
  const T sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}
}  // namespace

void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in, const float* bias,
                       int64_t N, int M) {
  const PhaseScope phase(Phase::norms_elementwise);
  with_writer(out, [&](auto out_writer) {
    with_writer(pre_out, [&](auto pre_writer) {
      using PreWriter = decltype(pre_writer);
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float* in_row = pre_in + n * M;
        const auto pre_row = pre_writer.at(n * M);
        const auto out_row = out_writer.at(n * M);
        int m = 0;
        for (; m + kNativeLanes <= M; m += kNativeLanes) {
          NativeFloats x = load_native(in_row + m);
          if (bias != nullptr) x = x + load_native(bias + m);
          // Rounded to pre_out's type first (a no-op for fp32).
          for (int l = 0; l < kNativeLanes; ++l) x[l] = PreWriter::round(x[l]);
          write_native(pre_row, m, x);
          write_native(out_row, m, gelu(x));
        }
        for (; m < M; ++m) {
          const float x = PreWriter::round(bias != nullptr ? in_row[m] + bias[m] : in_row[m]);
          pre_row(m, x);
          out_row(m, gelu(x));
        }
      }
    });
  });
}

void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre, int64_t count) {
  const PhaseScope phase(Phase::norms_elementwise);
  constexpr int64_t kGrain = 4096;  // a multiple of every vector width
  const int64_t num_chunks = (count + kGrain - 1) / kGrain;
  with_reader(pre, [&](auto read_pre) {
#pragma omp parallel for schedule(static)
    for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
      const int64_t begin = chunk * kGrain;
      const int64_t end = begin + kGrain < count ? begin + kGrain : count;
      int64_t i = begin;
      for (; i + kNativeLanes <= end; i += kNativeLanes)
        store_native(dinp + i, load_native(dout + i) * gelu_derivative(read_native(read_pre, i)));
      for (; i < end; ++i) dinp[i] = dout[i] * gelu_derivative(read_pre(i));
    }
  });
}

}  // namespace shardlm::cpu
