#include "shardlm/backend/cpu/embedding.hpp"

#include <algorithm>
#include <cstddef>

#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte, ConstTypedPtr wpe,
                       int B, int T, int C, DType value_type, const int32_t* positions) {
  const PhaseScope phase(Phase::norms_elementwise);
  const int64_t N = static_cast<int64_t>(B) * T;
  if (wpe.data == nullptr) {
    with_reader(wte, [&](auto token_table) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t token_row = static_cast<int64_t>(tokens[n]) * C;
        float* out_row = out + n * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) out_row[c] = round_to(value_type, token_table(token_row + c));
      }
    });
    return;
  }
  with_reader(wte, [&](auto token_table) {
    with_reader(wpe, [&](auto position_table) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t token_row = static_cast<int64_t>(tokens[n]) * C;
        const int64_t position_row =
            static_cast<int64_t>(positions != nullptr ? positions[n] : n % T) * C;
        float* out_row = out + n * C;
#pragma omp simd
        for (int c = 0; c < C; ++c)
          out_row[c] = round_to(value_type, token_table(token_row + c)) +
                       round_to(value_type, position_table(position_row + c));
      }
    });
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C, const int32_t* positions) {
  const PhaseScope phase(Phase::norms_elementwise);
  const int64_t N = static_cast<int64_t>(B) * T;
  constexpr int kColumnBlock = 64;
  const int num_blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel
  {
    // Token rows: a thread owns columns [c0, c1) of every row, so repeated tokens
    // are summed in token order by one thread.
#pragma omp for schedule(static)
    for (int block = 0; block < num_blocks; ++block) {
      const int c0 = block * kColumnBlock;
      const int c1 = std::min(C, c0 + kColumnBlock);
      for (int64_t n = 0; n < N; ++n) {
        float* grad_row = dwte + static_cast<int64_t>(tokens[n]) * C;
        const float* dout_row = dout + n * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) grad_row[c] += dout_row[c];
      }
      // Packed position ids repeat within a row like tokens do: the same column
      // ownership keeps the sum in row order without atomics.
      for (int64_t n = 0; n < (dwpe != nullptr && positions != nullptr ? N : 0); ++n) {
        float* grad_row = dwpe + static_cast<int64_t>(positions[n]) * C;
        const float* dout_row = dout + n * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) grad_row[c] += dout_row[c];
      }
    }
    // Position rows t = 0..T-1: each position is owned by one thread.
#pragma omp for schedule(static)
    for (int t = 0; t < (dwpe != nullptr && positions == nullptr ? T : 0); ++t) {
      float* grad_row = dwpe + static_cast<int64_t>(t) * C;
      for (int b = 0; b < B; ++b) {
        const float* dout_row = dout + (static_cast<int64_t>(b) * T + t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) grad_row[c] += dout_row[c];
      }
    }
  }
}

}  // namespace shardlm::cpu
