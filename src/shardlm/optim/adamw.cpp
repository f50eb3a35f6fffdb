#include "shardlm/optim/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/core/phase_profile.hpp"

namespace shardlm {

std::vector<ElementRange> weight_decay_ranges(const UnitLayout& unit, int64_t slice_begin,
                                              int64_t slice_end) {
  std::vector<ElementRange> ranges;
  for (const auto& p : unit.params) {
    if (!p.weight_decay) continue;
    int64_t begin = std::max(p.offset, slice_begin);
    int64_t end = std::min(p.offset + p.numel, slice_end);
    if (begin < end) ranges.push_back({begin - slice_begin, end - slice_begin});
  }
  return ranges;
}

namespace {

// The Adam moment update and parameter step over [begin, end); decay_factor is
// 1 - lr*wd for decayed ranges, 1 otherwise.
void adam_range(float* params, const float* grads, float* m, float* v, int64_t begin, int64_t end,
                float decay_factor, float grad_multiplier, float beta1, float beta2,
                float step_size, float bias2_sqrt, float eps) {
  const float one_minus_beta1 = 1.0f - beta1;
  const float one_minus_beta2 = 1.0f - beta2;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = begin; i < end; ++i) {
    float g = grads[i] * grad_multiplier;
    float p = params[i] * decay_factor;
    float mi = beta1 * m[i] + one_minus_beta1 * g;
    float vi = beta2 * v[i] + one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    float denom = std::sqrt(vi) / bias2_sqrt + eps;
    params[i] = p - step_size * (mi / denom);
  }
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                  int64_t step, const AdamWConfig& config) {
  const PhaseScope phase(Phase::optimizer);
  const double bias1 = 1.0 - std::pow(static_cast<double>(config.beta1), static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(static_cast<double>(config.beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  const float decay_factor = 1.0f - lr * config.weight_decay;
  int64_t cursor = 0;
  for (const auto& r : decay_ranges) {
    if (cursor < r.begin)
      adam_range(params, grads, m, v, cursor, r.begin, 1.0f, grad_multiplier, config.beta1,
                 config.beta2, step_size, bias2_sqrt, config.eps);
    adam_range(params, grads, m, v, r.begin, r.end, decay_factor, grad_multiplier, config.beta1,
               config.beta2, step_size, bias2_sqrt, config.eps);
    cursor = r.end;
  }
  if (cursor < n)
    adam_range(params, grads, m, v, cursor, n, 1.0f, grad_multiplier, config.beta1, config.beta2,
               step_size, bias2_sqrt, config.eps);
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
    double total = 0.0;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) total += static_cast<double>(data[i]) * data[i];
    block_sums[static_cast<size_t>(b)] = total;
  }
  double total = 0.0;
  for (double s : block_sums) total += s;
  return total;
}

float clip_multiplier(double global_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = max_norm / (global_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace shardlm
