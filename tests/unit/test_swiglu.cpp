// SwiGLU (swiglu.hpp) against a naive double implementation written here, element by
// element within bounds derived from fp32's rounding, on odd shapes (37 rows, I = 24,
// 40, 1000); the naive backward checked by finite differences; compute-type inputs and
// outputs, and the fused variant that stores the rounded GEMM output.
//
// Bounds (u = 2^-24): sigmoid(g) = 1 / (1 + e^-g) with exp_approx (< 3e-7 = 5u
// relative), the add and the division: 7u relative. h = g sigmoid(g) up, two more
// products: |dh| <= 9u |h|. Backward: dup = dh g sigmoid: 9u |dup|; dgate = dh up sigmoid
// (1 + g (1 - sigmoid)): the factor (1 + g (1 - sigmoid)) can cancel, so its error is
// bounded by its terms' magnitudes, 8u (1 + 2|g|) (sigmoid's 7u times |g| sigmoid,
// the rounding of 1 - sigmoid, the product and the sum), plus 4u for the products:
// |d dgate| <= 12u |dh up| sigmoid (1 + 2|g|). An absolute 1e-30 covers exp's clamp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/swiglu.hpp"
#include "shardlm/core/error.hpp"
#include "kernel_test_helpers.hpp"
#include "relative_error.hpp"

namespace {

using namespace kernel_test;
using shardlm::ConstTypedPtr;
using shardlm::DType;
using shardlm::TypedPtr;

constexpr double u = 0x1p-24;

struct Reference {
  DVec h, h_bound, dgate_up, dgate_up_bound;
};

Reference reference(const DVec& gate_up, const DVec& dh, int64_t N, int I) {
  Reference r;
  r.h.assign(static_cast<size_t>(N * I), 0.0);
  r.h_bound = r.h;
  r.dgate_up.assign(gate_up.size(), 0.0);
  r.dgate_up_bound = r.dgate_up;
  for (int64_t n = 0; n < N; ++n)
    for (int i = 0; i < I; ++i) {
      const size_t gi = static_cast<size_t>(n * 2 * I + i), ui = gi + I;
      const size_t hi = static_cast<size_t>(n * I + i);
      const double g = gate_up[gi], up = gate_up[ui], sig = 1.0 / (1.0 + std::exp(-g));
      r.h[hi] = g * sig * up;
      r.h_bound[hi] = 9 * u * std::fabs(r.h[hi]) + 1e-30;
      r.dgate_up[gi] = dh[hi] * up * sig * (1.0 + g * (1.0 - sig));
      r.dgate_up_bound[gi] = 12 * u * std::fabs(dh[hi] * up) * sig * (1 + 2 * std::fabs(g)) + 1e-30;
      r.dgate_up[ui] = dh[hi] * g * sig;
      r.dgate_up_bound[ui] = 9 * u * std::fabs(r.dgate_up[ui]) + 1e-30;
    }
  return r;
}

struct Shape {
  int64_t N;
  int I;
};
const Shape kShapes[] = {{37, 24}, {37, 40}, {5, 1000}, {1, 1}};

TEST(SwiGlu, ForwardAndBackwardMatchNaiveDouble) {
  uint64_t seed = 10;
  for (const auto [N, I] : kShapes) {
    const std::string what = "N " + std::to_string(N) + " I " + std::to_string(I);
    // Gates over [-12, 12]: sigmoid saturated at both ends and steep in between.
    const Vec gate_up = random_vec(static_cast<size_t>(N * 2 * I), ++seed, 4.0);
    const Vec dh = random_vec(static_cast<size_t>(N * I), ++seed);
    const Reference want = reference(to_double(gate_up), to_double(dh), N, I);
    Vec h(static_cast<size_t>(N * I));
    shardlm::cpu::swiglu_forward(h.data(), gate_up.data(), N, I);
    EXPECT_EQ(count_outside(h, want.h, want.h_bound, "h " + what), 0);
    Vec dgate_up(gate_up.size(), 123.0f);  // overwritten
    shardlm::cpu::swiglu_backward(dgate_up.data(), dh.data(), gate_up.data(), N, I);
    EXPECT_EQ(count_outside(dgate_up, want.dgate_up, want.dgate_up_bound, "dgate_up " + what), 0);
  }
}

TEST(SwiGlu, NaiveBackwardMatchesFiniteDifferences) {
  const int64_t N = 3;
  const int I = 5;
  const DVec gate_up = to_double(random_vec(N * 2 * I, 20, 2.0));
  const DVec dh = to_double(random_vec(N * I, 21));
  const DVec fd = finite_difference(
      [&](const DVec& v) { return dot(dh, reference(v, dh, N, I).h); }, gate_up);
  EXPECT_LT(relative_to_max_error(reference(gate_up, dh, N, I).dgate_up, fd), 1e-8);
}

TEST(SwiGlu, ComputeTypesAreTheFp32KernelOnTheStoredValues) {
  const int64_t N = 37;
  const int I = 40;
  const Vec gate_up = random_vec(N * 2 * I, 30, 4.0), dh = random_vec(N * I, 31);
  for (const DType type : {DType::bf16, DType::fp16}) {
    const std::string what(shardlm::dtype_name(type));
    // The fused variant stores gate_up rounded and computes h from the rounded values.
    Half stored(gate_up.size()), h16(static_cast<size_t>(N * I));
    shardlm::cpu::swiglu_forward(TypedPtr(h16.data(), type), TypedPtr(stored.data(), type),
                                 gate_up.data(), N, I);
    EXPECT_EQ(stored, to_half(type, gate_up)) << what;
    const Vec wide = widen(type, stored);
    Vec h32(h16.size());
    shardlm::cpu::swiglu_forward(h32.data(), wide.data(), N, I);
    EXPECT_EQ(h16, to_half(type, h32)) << what;  // fp32 on the stored values, rounded once
    Half h_from_stored(h16.size());
    shardlm::cpu::swiglu_forward(TypedPtr(h_from_stored.data(), type),
                                 ConstTypedPtr(stored.data(), type), N, I);
    EXPECT_EQ(h_from_stored, h16) << what;
    // Backward on the stored gate_up: the fp32 kernel on the widened values.
    Vec d16(gate_up.size()), d32(gate_up.size());
    shardlm::cpu::swiglu_backward(d16.data(), dh.data(), ConstTypedPtr(stored.data(), type), N, I);
    shardlm::cpu::swiglu_backward(d32.data(), dh.data(), wide.data(), N, I);
    EXPECT_EQ(d16, d32) << what;
  }
  // fp32 fused, in place: the plain forward's result.
  Vec in_place = gate_up, h_fused(static_cast<size_t>(N * I)), h_plain(h_fused.size());
  shardlm::cpu::swiglu_forward(h_fused.data(), in_place.data(), in_place.data(), N, I);
  shardlm::cpu::swiglu_forward(h_plain.data(), gate_up.data(), N, I);
  EXPECT_EQ(in_place, gate_up);
  EXPECT_EQ(h_fused, h_plain);
}

TEST(SwiGlu, SaturatedGatesStayFinite) {
  const Vec gate_up = {-200.0f, -90.0f, 90.0f, 200.0f, 1.0f, 2.0f, 3.0f, 4.0f};
  const Vec dh = {1.0f, 1.0f, 1.0f, 1.0f};
  Vec h(4), d(8);
  shardlm::cpu::swiglu_forward(h.data(), gate_up.data(), 1, 4);
  shardlm::cpu::swiglu_backward(d.data(), dh.data(), gate_up.data(), 1, 4);
  for (float v : h) EXPECT_TRUE(std::isfinite(v));
  for (float v : d) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(h[3], 200.0f * 4.0f);  // silu(200) = 200 in fp32
  EXPECT_NEAR(h[0], 0.0f, 1e-30f);
}

TEST(SwiGlu, RejectsBadShapes) {
  Vec buf(8);
  EXPECT_THROW(shardlm::cpu::swiglu_forward(buf.data(), buf.data(), 1, 0), shardlm::Error);
  EXPECT_THROW(shardlm::cpu::swiglu_backward(buf.data(), buf.data(), buf.data(), -1, 2),
               shardlm::Error);
}

}  // namespace
