#include "shardlm/backend/cpu/swiglu.hpp"

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

// 1 / (1 + e^-g). exp_approx clamps its argument to [-87, 88], so a gate of any size
// gives a finite sigmoid in (0, 1] (~e^-88 for g below -88), never NaN.
inline float sigmoid(float g) { return 1.0f / (1.0f + exp_approx(-g)); }

void check_shape(int64_t N, int I) {
  SHARDLM_CHECK(N >= 0 && I > 0, "swiglu: {} rows of intermediate size {}; expected I > 0", N, I);
}

}  // namespace

void swiglu_forward(TypedPtr h, ConstTypedPtr gate_up, int64_t N, int I) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_shape(N, I);
  with_reader(gate_up, [&](auto reader) {
    with_writer(h, [&](auto writer) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const auto gate = reader.at(n * 2 * I);
        const auto up = reader.at(n * 2 * I + I);
        const auto out = writer.at(n * I);
#pragma omp simd
        for (int i = 0; i < I; ++i) {
          const float g = gate(i);
          out(i, g * sigmoid(g) * up(i));
        }
      }
    });
  });
}

void swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float* gate_up_in, int64_t N, int I) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_shape(N, I);
  with_writer(gate_up_out, [&](auto stored) {
    with_writer(h, [&](auto writer) {
      using Stored = decltype(stored);
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float* in = gate_up_in + n * 2 * I;
        const auto row = stored.at(n * 2 * I);
        const auto out = writer.at(n * I);
#pragma omp simd
        for (int i = 0; i < I; ++i) {
          const float g = Stored::round(in[i]), u = Stored::round(in[I + i]);
          row(i, g);
          row(I + i, u);
          out(i, g * sigmoid(g) * u);
        }
      }
    });
  });
}

void swiglu_backward(float* dgate_up, const float* dh, ConstTypedPtr gate_up, int64_t N, int I) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_shape(N, I);
  with_reader(gate_up, [&](auto reader) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const auto gate = reader.at(n * 2 * I);
      const auto up = reader.at(n * 2 * I + I);
      const float* grad = dh + n * I;
      float* dgate = dgate_up + n * 2 * I;
      float* dup = dgate + I;
#pragma omp simd
      for (int i = 0; i < I; ++i) {
        const float g = gate(i), sig = sigmoid(g);
        const float silu = g * sig;
        dgate[i] = grad[i] * up(i) * sig * (1.0f + g * (1.0f - sig));
        dup[i] = grad[i] * silu;
      }
    }
  });
}

}  // namespace shardlm::cpu
