#include "shardlm/backend/cpu/lm_head_loss.hpp"

#include "shardlm/backend/kernel_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/backend/cpu/vector_math.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

// max(x[0], ..., x[n-1]) for n >= 1. fast_math's max_of compiles to scalar vmaxss when
// GCC 12 inlines it here (perf annotate: a quarter of the softmax's time), so the row
// maximum runs on explicit vectors (NativeFloats). max is exact, so the value is
// max_of's (inputs without NaN).
inline float row_max(const float* x, int n) {
  constexpr int W = kNativeLanes;
  if (n < W) {
    float m = x[0];
    for (int i = 1; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }
  auto max_of_lanes = [](NativeFloats a, NativeFloats b) { return a < b ? b : a; };
  NativeFloats m0 = load_native(x), m1 = m0, m2 = m0, m3 = m0;
  int j = 0;
  for (; j + 4 * W <= n; j += 4 * W) {
    m0 = max_of_lanes(m0, load_native(x + j));
    m1 = max_of_lanes(m1, load_native(x + j + W));
    m2 = max_of_lanes(m2, load_native(x + j + 2 * W));
    m3 = max_of_lanes(m3, load_native(x + j + 3 * W));
  }
  for (; j + W <= n; j += W) m0 = max_of_lanes(m0, load_native(x + j));
  // The last (overlapping) W values cover the tail.
  m1 = max_of_lanes(m1, load_native(x + n - W));
  const NativeFloats all = max_of_lanes(max_of_lanes(m0, m1), max_of_lanes(m2, m3));
  float m = all[0];
  for (int l = 1; l < W; ++l) m = std::max(m, all[l]);
  return m;
}

// Cross-entropy of one row of logits; with want_grad, grad_scale * (softmax - onehot)
// is written through `dlogits` (which may store into the logits row itself, fp32, or
// round into a compute-type row: the fp32 value is the same either way).
//
// A chunk's logits (tens of MiB) come from memory, and one thread's read of a row
// takes about as long as the exp pass over it. So the softmax numerators e^(l - max)
// are computed one cache line at a time while the thread's next row (`next_row`, or
// nullptr) is prefetched into L2, a line per line: the row's first pass then finds it
// in L2. The numerators go to `numerators`: the logits row itself when dlogits are
// written there (fp32), else a per-thread scratch row, which stays in L2 and leaves
// the logits row clean (no write-back to memory).
//
// The numerators are exp_approx's bits (exp_approx_vector), and their sum runs in 16
// lanes, lane l over j = l mod 16 of the whole lines in order, the tail elements into
// lane 0, the lanes added in order: the order of the `omp simd reduction` loop this
// replaced (GCC 12, AVX-512), so fp32 losses and gradients of the GPT-2 vocabulary
// (50257 = 3141 lines + 1) are bitwise unchanged (checked on 3 training steps). The 16
// lanes are kParts native vectors (one zmm, or two ymm on AVX2).
template <typename Writer>
float row_cross_entropy(const float* logits, float* numerators, int V, int32_t target,
                        bool want_grad, float grad_scale, Writer dlogits, const float* next_row) {
  constexpr int kParts = kLanes / kNativeLanes;
  const float max_logit = row_max(logits, V);
  const float target_logit = logits[target];
  NativeFloats lane_sums[kParts] = {};
  const NativeFloats max_value = NativeFloats{} + max_logit;
  int j0 = 0;
  for (; j0 + kLanes <= V; j0 += kLanes) {
    if (next_row != nullptr) __builtin_prefetch(next_row + j0, 0, 2);
    for (int part = 0; part < kParts; ++part) {
      const int j = j0 + part * kNativeLanes;
      const NativeFloats e =
          exp_approx_vector<NativeFloats, NativeInts>(load_native(logits + j) - max_value);
      store_native(numerators + j, e);
      lane_sums[part] += e;
    }
  }
  float lanes[kLanes];
  static_assert(sizeof(lanes) == sizeof(lane_sums));
  std::memcpy(lanes, lane_sums, sizeof(lanes));
  for (int j = j0; j < V; ++j) {
    const float e = exp_approx(logits[j] - max_logit);
    numerators[j] = e;
    lanes[0] += e;
  }
  float sum = 0.0f;
  for (const float lane : lanes) sum += lane;
  if (want_grad) {
    const float factor = grad_scale / sum;
    const float target_grad = numerators[target] * factor - grad_scale;
#pragma omp simd
    for (int j = 0; j < V; ++j) dlogits(j, numerators[j] * factor);
    dlogits(target, target_grad);
  }
  return max_logit + std::log(sum) - target_logit;
}

}  // namespace

void lm_head_cross_entropy(const LmHeadLossArgs& a, float* losses, float* dx, float* dweight) {
  // Its GEMMs (and dlogits rounding) are charged to their own phases by nesting.
  const PhaseScope phase(Phase::loss);
  const bool want_grad = dx != nullptr;
  const bool round_dlogits = a.x.dtype != DType::fp32;
  check_lm_head_args(a, want_grad);
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
      // In place only where the dlogits are the logits themselves.
      const bool in_place = want_grad && !round_dlogits;
#pragma omp parallel
      {
        // One row of numerators per thread, grown once and counted by the tracker.
        thread_local TrackedBuffer numerator_scratch;
        float* numerators =
            in_place ? nullptr
                     : static_cast<float*>(numerator_scratch.grow_to(
                           MemCategory::other, static_cast<size_t>(a.V) * sizeof(float)));
#pragma omp for schedule(static)
        for (int r = 0; r < rows; ++r) {
          float* row = logits + static_cast<int64_t>(r) * ld;
          const auto grad_row = writer.at(static_cast<int64_t>(r) * ld);
          if (targets[r] < 0) {
            losses[r0 + r] = 0.0f;
            if (want_grad)
              for (int j = 0; j < a.V; ++j) grad_row(j, 0.0f);
          } else {
            const float* next_row = r + 1 < rows ? row + ld : nullptr;
            losses[r0 + r] = row_cross_entropy(row, in_place ? row : numerators,
                                               a.V, targets[r], want_grad, a.grad_scale,
                                               grad_row, next_row);
          }
        }
      }
    });
    if (want_grad) {
      // dx_rows = dlogits W;  dW += dlogits^T x_rows.
      gemm(false, false, rows, a.C, a.V, 1.0f, dlogits, ld, a.weight, a.C, 0.0f, dx + r0 * a.C,
           a.C);
      if (dweight != nullptr)  // null: a frozen head (LoRA)
        gemm(true, false, a.V, a.C, rows, 1.0f, dlogits, ld, x, a.C, 1.0f, dweight, a.C);
    }
  }
}

}  // namespace shardlm::cpu
