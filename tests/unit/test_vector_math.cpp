// vector_math.hpp against the scalar functions it stands in for: exp_lanes must give
// exp_approx's bits lane for lane (the LM head's fp32 results depend on it), and the
// lane max must be std::max.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/vector_math.hpp"
#include "shardlm/core/rng.hpp"

namespace {

using shardlm::cpu::Float16Lanes;
using shardlm::cpu::kLanes;

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
  while (x.size() % kLanes != 0) x.push_back(0.25f);
  return x;
}

TEST(VectorMath, ExpLanesEqualsExpApproxBitForBit) {
  const std::vector<float> x = exp_inputs();
  std::vector<float> want(x.size()), got(x.size());
  // exp_approx the way the kernels used it: inside an omp simd loop.
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) want[i] = shardlm::cpu::exp_approx(x[i]);
  for (size_t i = 0; i < x.size(); i += kLanes)
    shardlm::cpu::store_lanes(got.data() + i,
                              shardlm::cpu::exp_lanes(shardlm::cpu::load_lanes(x.data() + i)));
  size_t mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]) && mismatches++ < 5) {
      ADD_FAILURE() << "x " << x[i] << ": exp_lanes " << got[i] << ", exp_approx " << want[i];
    }
  }
  EXPECT_EQ(mismatches, 0u);
  // And both are exp: ~2 ulp relative inside the range (the reference in double).
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > -80.0f && x[i] < 80.0f) {
      ASSERT_NEAR(got[i] / std::exp(static_cast<double>(x[i])), 1.0, 4e-7) << "x " << x[i];
    }
  }
}

// The 8-lane instantiation (one ymm register; the attention kernels' exp on AVX2).
TEST(VectorMath, EightLaneExpEqualsExpApproxBitForBit) {
  using Float8 = float __attribute__((vector_size(32)));
  using Int8 = int32_t __attribute__((vector_size(32)));
  const std::vector<float> x = exp_inputs();
  size_t mismatches = 0;
  for (size_t i = 0; i + 8 <= x.size(); i += 8) {
    Float8 v;
    std::memcpy(&v, x.data() + i, sizeof(v));
    const Float8 e = shardlm::cpu::exp_approx_vector<Float8, Int8>(v);
    for (int l = 0; l < 8; ++l) {
      const float want = shardlm::cpu::exp_approx(x[i + l]);
      if (std::bit_cast<uint32_t>(e[l]) != std::bit_cast<uint32_t>(want) && mismatches++ < 5)
        ADD_FAILURE() << "x " << x[i + l] << ": " << e[l] << ", exp_approx " << want;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(VectorMath, MaxLanesIsStdMax) {
  shardlm::Rng rng(9);
  for (int trial = 0; trial < 100; ++trial) {
    float a[kLanes], b[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      a[l] = static_cast<float>(rng.normal());
      b[l] = l % 5 == 0 ? a[l] : static_cast<float>(rng.normal());
    }
    const Float16Lanes m =
        shardlm::cpu::max_lanes(shardlm::cpu::load_lanes(a), shardlm::cpu::load_lanes(b));
    for (int l = 0; l < kLanes; ++l) ASSERT_EQ(m[l], std::max(a[l], b[l]));
  }
}

}  // namespace
