#include "shardlm/backend/cpu/swiglu.hpp"

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/vector_math.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

// The formulas on a float or a native vector of floats (exp_approx either way): the
// rows run a vector at a time and their tails element by element. (In an `omp simd`
// loop GCC 12 left these scalar: exp_approx's clamps.)
inline float exp_of(float x) { return exp_approx(x); }
inline NativeFloats exp_of(NativeFloats x) { return exp_approx_native(x); }

// 1 / (1 + e^-g). exp_approx clamps its argument to [-87, 88], so a gate of any size
// gives a finite sigmoid in (0, 1] (~e^-88 for g below -88), never NaN.
template <typename T>
inline T sigmoid(T g) {
  return 1.0f / (1.0f + exp_of(-g));
}

template <typename T>
inline T swiglu(T g, T up) {
  return g * sigmoid(g) * up;
}

// d/dgate and d/dup of swiglu at (g, up), times the incoming gradient dh.
template <typename T>
inline void swiglu_gradient(T g, T up, T dh, T& dgate, T& dup) {
  const T sig = sigmoid(g);
  dgate = dh * up * sig * (1.0f + g * (1.0f - sig));
  dup = dh * (g * sig);
}

void check_shape(int64_t N, int I) {
  SHARDLM_CHECK(N >= 0 && I > 0, "swiglu: {} rows of intermediate size {}; expected I > 0", N, I);
}

// h = swiglu(gate, up) over one row: gate and up read through readers, h written.
template <typename Reader, typename Writer>
inline void swiglu_row(Writer h, Reader gate, Reader up, int I) {
  int i = 0;
  for (; i + kNativeLanes <= I; i += kNativeLanes)
    write_native(h, i, swiglu(read_native(gate, i), read_native(up, i)));
  for (; i < I; ++i) h(i, swiglu(gate(i), up(i)));
}

}  // namespace

void swiglu_forward(TypedPtr h, ConstTypedPtr gate_up, int64_t N, int I) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_shape(N, I);
  with_reader(gate_up, [&](auto reader) {
    with_writer(h, [&](auto writer) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n)
        swiglu_row(writer.at(n * I), reader.at(n * 2 * I), reader.at(n * 2 * I + I), I);
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
        // Round the row into gate_up_out, then compute h from what was stored.
        const float* in = gate_up_in + n * 2 * I;
        const auto row = stored.at(n * 2 * I);
#pragma omp simd
        for (int i = 0; i < 2 * I; ++i) row(i, Stored::round(in[i]));
        const ConstTypedPtr rounded(row.p, gate_up_out.dtype);
        with_reader(rounded, [&](auto reader) {
          swiglu_row(writer.at(n * I), reader, reader.at(I), I);
        });
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
      int i = 0;
      for (; i + kNativeLanes <= I; i += kNativeLanes) {
        NativeFloats dg, du;
        swiglu_gradient(read_native(gate, i), read_native(up, i), load_native(grad + i), dg, du);
        store_native(dgate + i, dg);
        store_native(dup + i, du);
      }
      for (; i < I; ++i) swiglu_gradient(gate(i), up(i), grad[i], dgate[i], dup[i]);
    }
  });
}

}  // namespace shardlm::cpu
