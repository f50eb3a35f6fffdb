// 16-float vectors (one 64-byte cache line, one AVX-512 register) for the loss and
// elementwise kernels, written with GCC vector extensions.
//
// Why not `omp simd` over fast_math's scalar functions: GCC 12 compiles exp_approx's
// two range clamps inside a simd loop into mask-register compares and masked blends
// (and keeps max_of scalar when it is inlined into the LM head), which costs the LM
// head's softmax several percent. Why not AVX-512 intrinsics: GCC 12 warns
// (-Wuninitialized) about their internal undefined vectors.
//
// exp_lanes runs exp_approx's operations in exp_approx's order, so each lane is
// exp_approx's value bit for bit (tests/unit/test_vector_math.cpp checks it).
#pragma once

#include <cstdint>
#include <cstring>

#include "shardlm/backend/cpu/fast_math.hpp"

namespace shardlm::cpu {

using Float16Lanes = float __attribute__((vector_size(64)));
using Int16Lanes = int32_t __attribute__((vector_size(64)));
inline constexpr int kLanes = 16;

inline Float16Lanes broadcast_lanes(float value) { return Float16Lanes{} + value; }

inline Float16Lanes load_lanes(const float* p) {
  Float16Lanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store_lanes(float* p, Float16Lanes v) { std::memcpy(p, &v, sizeof(v)); }

// Lane-wise std::max(a, b) (b where a < b).
inline Float16Lanes max_lanes(Float16Lanes a, Float16Lanes b) { return a < b ? b : a; }

// exp_approx (fast_math.hpp) on a GCC vector of floats F (I: the int32 vector of as
// many lanes): the same clamp and exp_approx_clamped, so each lane is exp_approx's bits.
template <typename F, typename I>
inline F exp_approx_vector(F x) {
  const F lo = F{} - 87.0f, hi = F{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  return exp_approx_clamped(x, [](F n) {
    const I exponent_bits = (__builtin_convertvector(n, I) + 127) << 23;
    F scale;
    std::memcpy(&scale, &exponent_bits, sizeof(scale));
    return scale;
  });
}

// exp_approx on 16 lanes.
inline Float16Lanes exp_lanes(Float16Lanes x) {
  return exp_approx_vector<Float16Lanes, Int16Lanes>(x);
}

}  // namespace shardlm::cpu
