#include "shardlm/backend/cpu/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm {

namespace {

struct AdamConstants {
  float decay_factor, grad_multiplier, beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size, bias2_sqrt, eps;
};

// The Adam moment update and parameter step of elements [begin, end), one at a time.
// The multiply-adds are explicit fused ones (the compiler would otherwise contract
// some of them as it pleases), so this and the vector version below give bitwise the
// same results:
//   g = grad * multiplier;  m = fma(b1, m, (1-b1) g);  v = fma(b2, v, ((1-b2) g) g)
//   p = fma(-step_size, m / (sqrt(v) / bias2_sqrt + eps), p * decay_factor)
inline void adam_scalar(float* params, const float* grads, float* m, float* v, int64_t begin,
                        int64_t end, const AdamConstants& c) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = grads[i] * c.grad_multiplier;
    const float p = params[i] * c.decay_factor;
    const float mi = std::fma(c.beta1, m[i], c.one_minus_beta1 * g);
    const float vi = std::fma(c.beta2, v[i], (c.one_minus_beta2 * g) * g);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / c.bias2_sqrt + c.eps;
    params[i] = std::fma(-c.step_size, mi / denom, p);
  }
}

// The same, 16 elements per instruction. std::sqrt keeps the loop above scalar (it
// may set errno, and the build does not say -fno-math-errno), which made AdamW
// compute-bound at ~7 GB/s per thread.
inline void adam_block(float* params, const float* grads, float* m, float* v, int64_t begin,
                       int64_t end, const AdamConstants& c) {
#if defined(__AVX512F__)
  const __m512 grad_multiplier = _mm512_set1_ps(c.grad_multiplier);
  const __m512 decay_factor = _mm512_set1_ps(c.decay_factor);
  const __m512 beta1 = _mm512_set1_ps(c.beta1), beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 bias2_sqrt = _mm512_set1_ps(c.bias2_sqrt), eps = _mm512_set1_ps(c.eps);
  const __m512 minus_step_size = _mm512_set1_ps(-c.step_size);
  for (; begin + 16 <= end; begin += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grads + begin), grad_multiplier);
    const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(params + begin), decay_factor);
    const __m512 mi =
        _mm512_fmadd_ps(beta1, _mm512_loadu_ps(m + begin), _mm512_mul_ps(one_minus_beta1, g));
    const __m512 vi = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(v + begin),
                                      _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    _mm512_storeu_ps(m + begin, mi);
    _mm512_storeu_ps(v + begin, vi);
    // maskz with every lane set: _mm512_sqrt_ps trips GCC 12's -Wmaybe-uninitialized.
    const __m512 sqrt_vi = _mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xffff), vi);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(sqrt_vi, bias2_sqrt), eps);
    _mm512_storeu_ps(params + begin,
                     _mm512_fmadd_ps(minus_step_size, _mm512_div_ps(mi, denom), p));
  }
#endif
  adam_scalar(params, grads, m, v, begin, end, c);
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                  int64_t step, const AdamWConfig& config, TypedPtr rounded_params) {
  const PhaseScope phase(Phase::optimizer);
  const double bias1 = 1.0 - std::pow(static_cast<double>(config.beta1), static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(static_cast<double>(config.beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  const float decay_factor = 1.0f - lr * config.weight_decay;
  const AdamConstants plain{1.0f,         grad_multiplier, config.beta1, config.beta2,
                            1.0f - config.beta1, 1.0f - config.beta2, step_size, bias2_sqrt,
                            config.eps};
  AdamConstants decayed = plain;
  decayed.decay_factor = decay_factor;
  // One parallel region over fixed-size blocks, each split at the (sorted, disjoint)
  // decay ranges it meets: a region per range cost a few microseconds each on an idle
  // machine and up to a scheduler time slice each on a busy one.
  constexpr int64_t kBlock = 1 << 14;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kBlock;
    const int64_t end = std::min(n, begin + kBlock);
    int64_t cursor = begin;
    for (const auto& r : decay_ranges) {
      if (r.end <= cursor) continue;
      if (r.begin >= end) break;
      if (cursor < r.begin) adam_block(params, grads, m, v, cursor, r.begin, plain);
      const int64_t decayed_end = std::min(r.end, end);
      adam_block(params, grads, m, v, std::max(cursor, r.begin), decayed_end, decayed);
      cursor = decayed_end;
    }
    if (cursor < end) adam_block(params, grads, m, v, cursor, end, plain);
    if (rounded_params.data != nullptr)
      cpu::convert_in_thread(rounded_params.at(begin), params + begin, end - begin);
  }
}

double sum_of_squares(const float* data, int64_t n) {
  const PhaseScope phase(Phase::optimizer);
  // Fixed-size blocks summed in order: the result does not depend on the thread
  // count, so runs with different --threads agree bitwise.
  constexpr int64_t kBlock = 4096;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> block_sums(static_cast<size_t>(num_blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < num_blocks; ++b) {
    // Eight interleaved partial sums (element i into lane i % 8), added in lane order:
    // a fixed order the compiler can vectorize.
    constexpr int kLanes = 8;
    double lanes[kLanes] = {};
    const int64_t begin = b * kBlock;
    const int64_t end = std::min(n, begin + kBlock);
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (int l = 0; l < kLanes; ++l)
        lanes[l] += static_cast<double>(data[i + l]) * static_cast<double>(data[i + l]);
    for (int l = 0; i < end; ++i, ++l) lanes[l] += static_cast<double>(data[i]) * data[i];
    double total = 0.0;
    for (double lane : lanes) total += lane;
    block_sums[static_cast<size_t>(b)] = total;
  }
  double total = 0.0;
  for (double s : block_sums) total += s;
  return total;
}

}  // namespace shardlm
