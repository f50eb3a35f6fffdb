#include "shardlm/comm/reduce_kernels.hpp"

#include <algorithm>
#include <cstring>

#include "shardlm/core/dtype.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

// acc[i] = acc[i] op x[i]; the switch sits outside the loop so each loop vectorises.
template <typename T>
inline void accumulate(T* acc, const T* x, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
      return;
    case ReduceOp::max:
      for (size_t i = 0; i < n; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
      return;
    case ReduceOp::min:
      for (size_t i = 0; i < n; ++i) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
      return;
  }
}

template <typename T>
void reduce_gathered_impl(const T* gathered, int num_ranks, size_t count, T* out, ReduceOp op) {
  SHARDLM_ASSERT(num_ranks >= 1);
  if (count == 0) return;
  std::memcpy(out, gathered, count * sizeof(T));
  for (int r = 1; r < num_ranks; ++r)
    accumulate(out, gathered + static_cast<size_t>(r) * count, count, op);
}

}  // namespace

void reduce_in_rank_order(const float* const* inputs, int num_inputs, float* out, size_t count,
                          ReduceOp op) {
  SHARDLM_ASSERT(num_inputs >= 1);
  // A small tile stays in L1; reading every input's tile before writing `out` keeps
  // the in-place case (out == inputs[k]) correct.
  constexpr size_t kTile = 2048;
  alignas(64) float acc[kTile];
  for (size_t base = 0; base < count; base += kTile) {
    const size_t n = std::min(kTile, count - base);
    std::memcpy(acc, inputs[0] + base, n * sizeof(float));
    for (int r = 1; r < num_inputs; ++r) accumulate(acc, inputs[r] + base, n, op);
    std::memcpy(out + base, acc, n * sizeof(float));
  }
}

void reduce_in_rank_order(const uint16_t* const* bf16_inputs, int num_inputs, float* out,
                          size_t count, ReduceOp op) {
  SHARDLM_ASSERT(num_inputs >= 1);
  constexpr size_t kTile = 2048;
  alignas(64) float widened[kTile];
  const auto widen = [](float* dst, const uint16_t* src, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  };
  for (size_t base = 0; base < count; base += kTile) {
    const size_t n = std::min(kTile, count - base);
    widen(out + base, bf16_inputs[0] + base, n);
    for (int r = 1; r < num_inputs; ++r) {
      widen(widened, bf16_inputs[r] + base, n);
      accumulate(out + base, widened, n, op);
    }
  }
}

void reduce_gathered(const float* gathered, int num_ranks, size_t count, float* out, ReduceOp op) {
  reduce_gathered_impl(gathered, num_ranks, count, out, op);
}
void reduce_gathered(const double* gathered, int num_ranks, size_t count, double* out,
                     ReduceOp op) {
  reduce_gathered_impl(gathered, num_ranks, count, out, op);
}
void reduce_gathered(const int64_t* gathered, int num_ranks, size_t count, int64_t* out,
                     ReduceOp op) {
  reduce_gathered_impl(gathered, num_ranks, count, out, op);
}

}  // namespace shardlm
