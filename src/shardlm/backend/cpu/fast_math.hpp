// Vectorizable exp and tanh for the CPU kernels.
//
// std::exp / std::tanh are scalar library calls unless the whole build uses
// -ffast-math, and softmax rows (50257 wide) and GELU (4C per token) call them
// millions of times per step. These inline versions are plain arithmetic that the
// compiler vectorizes inside `#pragma omp simd` loops. exp_approx has ~2 ulp
// relative error (Cephes expf polynomial) over the clamped range.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace shardlm::cpu {

// exp_approx's arithmetic after its range clamp, for F = float or a GCC vector of
// floats (vector_math.hpp's Float16Lanes), so the scalar and the 16-lane exp are one
// formula, bit for bit. two_to(n) is 2^n for the integer-valued n.
template <typename F, typename TwoTo>
inline F exp_approx_clamped(F x, TwoTo two_to) {
  // Round x / ln2 to the nearest integer by adding and subtracting 1.5 * 2^23 (the
  // float's ulp is 1 there): plain arithmetic, so it stays inline and vectorizes
  // where std::floor / std::nearbyint may become library calls.
  constexpr float kRoundMagic = 12582912.0f;
  const F n = (x * 1.44269504088896341f + kRoundMagic) - kRoundMagic;
  // x - n ln2 in two parts so the reduced argument keeps full precision.
  const F r = x - n * 0.693359375f + n * 2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;  // F{} + c: c itself, or c in every lane
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F y = p * r * r + r + 1.0f;
  return y * two_to(n);
}

// e^x for x in [-87, 88]; inputs outside are clamped (e^-87 ~ 1.6e-38 stands in
// for 0, which only matters as a softmax weight next to terms >= 1).
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  return exp_approx_clamped(x, [](float n) {
    return std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  });
}

// max(x[0], ..., x[n-1]) (-inf for n = 0) in 16 running maxima combined at the end:
// GCC 12 keeps an `omp simd reduction(max)` loop over floats scalar (it was 60% of the
// LM head's softmax), but vectorizes this. max is exact, so the value is a sequential
// scan's (inputs without NaN).
inline float max_of(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes];
  for (float& lane : lanes) lane = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], x[i + l]);
  float m = -INFINITY;
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (float lane : lanes) m = std::max(m, lane);
  return m;
}

// Of a key block starting at j0 with nk keys, keys j0 + [0, visible) are visible to
// query i: the causal prefix within the block.
inline int visible_keys(int i, int j0, int nk) { return std::min(nk, i - j0 + 1); }

// One key block of flash attention's online softmax for one query row. p[0, valid)
// holds the raw scores q.k; on return p[j] = e^(p[j] scale - m) with m the row's new
// running max, p[valid, width) = 0, and row_max / row_sum are updated (the old sum is
// rescaled to the new max). Returns that rescaling factor e^(old max - new max), for
// the row's output accumulator (0 on the first block).
inline float online_softmax_block(float* p, int valid, int width, float scale, float& row_max,
                                 float& row_sum) {
  // max_j(p_j * scale) == max_j(p_j) * scale exactly (scale > 0, rounding monotone).
  const float block_max = max_of(p, valid) * scale;
  const float new_max = std::max(row_max, block_max);
  float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
  for (int j = 0; j < valid; ++j) {
    p[j] = exp_approx(p[j] * scale - new_max);
    block_sum += p[j];
  }
  std::fill(p + valid, p + width, 0.0f);
  const float correction = exp_approx(row_max - new_max);
  row_sum = row_sum * correction + block_sum;
  row_max = new_max;
  return correction;
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = e^{-2|x|}: absolute error ~1e-7.
inline float tanh_approx(float x) {
  const float e = exp_approx(-2.0f * std::fabs(x));
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

}  // namespace shardlm::cpu
