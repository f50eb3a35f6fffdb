#include "shardlm/backend/cpu/vocab_shard.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "shardlm/backend/cpu/fast_math.hpp"

namespace shardlm::cpu {

namespace {

bool holds(VocabShardRows shard, int32_t t) { return t >= shard.begin && t < shard.begin + shard.real; }

}  // namespace

void vocab_shard_localize(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                          VocabShardRows shard) {
  for (int64_t i = 0; i < n; ++i)
    local_tokens[i] = holds(shard, tokens[i]) ? static_cast<int32_t>(tokens[i] - shard.begin) : 0;
}

void vocab_shard_mask_rows(float* rows, const int32_t* tokens, int64_t n, int C,
                           VocabShardRows shard) {
  for (int64_t i = 0; i < n; ++i)
    if (!holds(shard, tokens[i])) std::memset(rows + i * C, 0, sizeof(float) * static_cast<size_t>(C));
}

void vocab_shard_row_max(float* row_max, const float* logits, int64_t ld, int rows,
                         VocabShardRows shard) {
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + r * ld;
    row_max[r] = shard.real > 0 ? *std::max_element(row, row + shard.real)
                                : -std::numeric_limits<float>::infinity();
  }
}

void vocab_shard_softmax_sums(float* sums, float* logits, int64_t ld, const float* row_max,
                              const int32_t* targets, int rows, VocabShardRows shard) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    float* row = logits + r * ld;
    const int32_t t = targets[r];
    sums[2 * r + 1] = t >= 0 && holds(shard, t) ? row[t - shard.begin] : 0.0f;
    float sum = 0.0f;  // in column order (no reassociation: the unsplit run's bits)
    for (int j = 0; j < shard.real; ++j) {
      row[j] = exp_approx(row[j] - row_max[r]);
      sum += row[j];
    }
    sums[2 * r] = sum;
  }
}

void vocab_shard_loss(float* losses, const float* row_max, const float* sums,
                      const int32_t* targets, int rows) {
  for (int r = 0; r < rows; ++r)
    losses[r] = targets[r] < 0 ? 0.0f : row_max[r] + std::log(sums[2 * r]) - sums[2 * r + 1];
}

void vocab_shard_softmax_backward(float* logits, int64_t ld, const float* sums,
                                  const int32_t* targets, int rows, float grad_scale,
                                  VocabShardRows shard) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    float* row = logits + r * ld;
    const int32_t t = targets[r];
    if (t < 0) {
      std::fill(row, row + shard.real, 0.0f);
      continue;
    }
    const float factor = grad_scale / sums[2 * r];
    for (int j = 0; j < shard.real; ++j) row[j] *= factor;
    if (holds(shard, t)) row[t - shard.begin] -= grad_scale;
  }
}

}  // namespace shardlm::cpu
