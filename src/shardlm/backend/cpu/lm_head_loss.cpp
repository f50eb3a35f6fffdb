#include "shardlm/backend/cpu/lm_head_loss.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

// Cross-entropy of one row of logits; with want_grad, grad_scale * (softmax - onehot)
// is written through `dlogits` (which may store into the logits row itself, fp32, or
// round into a compute-type row: the fp32 value is the same either way).
template <typename Writer>
float row_cross_entropy(float* logits, int V, int32_t target, bool want_grad, float grad_scale,
                        Writer dlogits) {
  const float max_logit = max_of(logits, V);
  const float target_logit = logits[target];
  float sum = 0.0f;
  if (want_grad) {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; ++j) {
      const float e = exp_approx(logits[j] - max_logit);
      logits[j] = e;
      sum += e;
    }
    const float factor = grad_scale / sum;
    const float target_grad = logits[target] * factor - grad_scale;
#pragma omp simd
    for (int j = 0; j < V; ++j) dlogits(j, logits[j] * factor);
    dlogits(target, target_grad);
  } else {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; ++j) sum += exp_approx(logits[j] - max_logit);
  }
  return max_logit + std::log(sum) - target_logit;
}

}  // namespace

void lm_head_cross_entropy(const LmHeadLossArgs& a, float* losses, float* dx, float* dweight) {
  // Its GEMMs (and dlogits rounding) are charged to their own phases by nesting.
  const PhaseScope phase(Phase::loss);
  SHARDLM_CHECK(a.chunk_rows > 0 && a.logits_stride >= a.V && a.V > 0,
                "lm head: bad chunking (chunk_rows {}, stride {}, vocab {})", a.chunk_rows,
                a.logits_stride, a.V);
  const bool want_grad = dx != nullptr;
  const bool round_dlogits = a.x.dtype != DType::fp32;
  SHARDLM_CHECK(!(want_grad && round_dlogits) || a.dlogits_scratch.dtype == a.x.dtype,
                "lm head: {} inputs need a {} dlogits scratch, got {}", dtype_name(a.x.dtype),
                dtype_name(a.x.dtype), dtype_name(a.dlogits_scratch.dtype));
  const int ld = static_cast<int>(a.logits_stride);
  for (int64_t r0 = 0; r0 < a.N; r0 += a.chunk_rows) {
    const int rows = static_cast<int>(std::min<int64_t>(a.chunk_rows, a.N - r0));
    const int32_t* targets = a.targets + r0;
    const ConstTypedPtr x = a.x.at(r0 * a.C);
    bool any_target = false;
    for (int r = 0; r < rows; ++r) any_target |= targets[r] >= 0;
    if (!any_target) {  // fully masked chunk (e.g. a prompt in SFT): nothing to compute
      std::fill(losses + r0, losses + r0 + rows, 0.0f);
      if (want_grad) std::memset(dx + r0 * a.C, 0, sizeof(float) * rows * a.C);
      continue;
    }
    float* logits = a.logits_scratch;
    gemm(false, true, rows, a.V, a.C, 1.0f, x, a.C, a.weight, a.C, 0.0f, logits, ld);
    // dlogits: in place over the logits (fp32), else rounded straight into the scratch.
    const TypedPtr dlogits = round_dlogits && want_grad ? a.dlogits_scratch : TypedPtr(logits);
    with_writer(dlogits, [&](auto writer) {
#pragma omp parallel for schedule(static)
      for (int r = 0; r < rows; ++r) {
        float* row = logits + static_cast<int64_t>(r) * ld;
        const auto grad_row = writer.at(static_cast<int64_t>(r) * ld);
        if (targets[r] < 0) {
          losses[r0 + r] = 0.0f;
          if (want_grad)
            for (int j = 0; j < a.V; ++j) grad_row(j, 0.0f);
        } else {
          losses[r0 + r] =
              row_cross_entropy(row, a.V, targets[r], want_grad, a.grad_scale, grad_row);
        }
      }
    });
    if (want_grad) {
      // dx_rows = dlogits W;  dW += dlogits^T x_rows.
      gemm(false, false, rows, a.C, a.V, 1.0f, dlogits, ld, a.weight, a.C, 0.0f, dx + r0 * a.C,
           a.C);
      gemm(true, false, a.V, a.C, rows, 1.0f, dlogits, ld, x, a.C, 1.0f, dweight, a.C);
    }
  }
}

}  // namespace shardlm::cpu
