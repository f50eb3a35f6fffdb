// Float vectors for the loss, attention and elementwise kernels, written with GCC vector
// extensions, and exp_approx on them.
//
// Why not `omp simd` over fast_math's scalar functions: GCC 12 leaves exp_approx's two
// range clamps scalar inside a simd loop on AVX2 (mask compares and blends on AVX-512),
// and keeps max_of scalar when it is inlined into the LM head. Why not AVX-512
// intrinsics: GCC 12 warns (-Wuninitialized) about their internal undefined vectors.
//
// exp_approx_vector runs exp_approx's operations in exp_approx's order, so each lane is
// exp_approx's value bit for bit (tests/unit/test_vector_math.cpp checks it).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// The lane count that defines the LM head's summation order (one 64-byte cache line).
inline constexpr int kLanes = 16;

// The widest float vector the build's target keeps in registers: 16 floats (zmm) with
// AVX-512, else 8 (ymm). GCC 12 keeps 64-byte vectors in memory on AVX2 (the LM head's
// row pass ran 2x slower on 16-float vectors there), so loops that must run fast on
// both work on NativeFloats, kLanes / kNativeLanes of them standing for 16 lanes.
#ifdef __AVX512F__
inline constexpr int kNativeLanes = 16;
#else
inline constexpr int kNativeLanes = 8;
#endif
using NativeFloats = float __attribute__((vector_size(kNativeLanes * sizeof(float))));
using NativeInts = int32_t __attribute__((vector_size(kNativeLanes * sizeof(int32_t))));

inline NativeFloats load_native(const float* p) {
  NativeFloats v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store_native(float* p, NativeFloats v) { std::memcpy(p, &v, sizeof(v)); }

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

inline NativeFloats exp_approx_native(NativeFloats x) {
  return exp_approx_vector<NativeFloats, NativeInts>(x);
}

// kNativeLanes values read through a dtype reader (core/dtype.hpp) from index i on,
// widened exactly; and written through a writer (rounded once to its type).
template <typename Reader>
inline NativeFloats read_native(Reader in, int64_t i) {
  if constexpr (std::is_same_v<Reader, Fp32Reader>) {
    return load_native(in.p + i);
  } else {
    float values[kNativeLanes];
    for (int l = 0; l < kNativeLanes; ++l) values[l] = in(i + l);
    return load_native(values);
  }
}
template <typename Writer>
inline void write_native(Writer out, int64_t i, NativeFloats v) {
  if constexpr (std::is_same_v<Writer, Fp32Writer>) {
    store_native(out.p + i, v);
  } else {
    for (int l = 0; l < kNativeLanes; ++l) out(i + l, v[l]);
  }
}

}  // namespace shardlm::cpu
