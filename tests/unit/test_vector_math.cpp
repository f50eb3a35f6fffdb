// vector_math.hpp against the scalar function it stands in for: exp_approx_vector must
// give exp_approx's bits lane for lane (the LM head's and attention's fp32 results
// depend on it), on 8 lanes (ymm), 16 (zmm) and the build's native vector.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/vector_math.hpp"
#include "shardlm/core/rng.hpp"

namespace {

// Inputs: a fine sweep over [-100, 100] (both clamps and the range between), the
// clamp edges and their neighbours, signed zeros, and random normals of several scales.
std::vector<float> exp_inputs() {
  std::vector<float> x;
  for (int i = -200000; i <= 200000; ++i) x.push_back(static_cast<float>(i) * 5e-4f);
  for (float edge : {-87.0f, 88.0f, -88.7f, 88.7f, 0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f})
    for (int k = -3; k <= 3; ++k)
      x.push_back(std::bit_cast<float>(std::bit_cast<int32_t>(edge) + k));
  shardlm::Rng rng(7);
  for (double scale : {0.1, 1.0, 10.0, 40.0})
    for (int i = 0; i < 20000; ++i) x.push_back(static_cast<float>(scale * rng.normal()));
  while (x.size() % 16 != 0) x.push_back(0.25f);
  return x;
}

// exp_approx_vector on F (I: its int vector) against exp_approx called the way the
// kernels used to (inside an omp simd loop), and both against exp in double.
template <typename F, typename I>
void check_exp(const char* what) {
  constexpr size_t kWidth = sizeof(F) / sizeof(float);
  const std::vector<float> x = exp_inputs();
  std::vector<float> want(x.size()), got(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) want[i] = shardlm::cpu::exp_approx(x[i]);
  for (size_t i = 0; i < x.size(); i += kWidth) {
    F v;
    std::memcpy(&v, x.data() + i, sizeof(v));
    const F e = shardlm::cpu::exp_approx_vector<F, I>(v);
    std::memcpy(got.data() + i, &e, sizeof(e));
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]) && mismatches++ < 5) {
      ADD_FAILURE() << what << " x " << x[i] << ": " << got[i] << ", exp_approx " << want[i];
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
  // And both are exp: ~2 ulp relative inside the range (the reference in double).
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > -80.0f && x[i] < 80.0f) {
      ASSERT_NEAR(got[i] / std::exp(static_cast<double>(x[i])), 1.0, 4e-7) << "x " << x[i];
    }
  }
}

TEST(VectorMath, ExpApproxVectorEqualsExpApproxBitForBit) {
  using Float8 = float __attribute__((vector_size(32)));
  using Int8 = int32_t __attribute__((vector_size(32)));
  using Float16 = float __attribute__((vector_size(64)));
  using Int16 = int32_t __attribute__((vector_size(64)));
  check_exp<Float8, Int8>("8 lanes");
  check_exp<Float16, Int16>("16 lanes");
  check_exp<shardlm::cpu::NativeFloats, shardlm::cpu::NativeInts>("native");
}

}  // namespace
