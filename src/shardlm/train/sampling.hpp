// Autoregressive sampling with temperature and top-k.
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/core/rng.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

struct SamplingOptions {
  int num_tokens = 100;
  float temperature = 1.0f;  // <= 0: greedy
  int top_k = 0;             // 0: whole vocabulary
  uint64_t seed = 1;
};

// Extends `prompt` (token ids, at least one) by num_tokens ids. The context fed to
// the model is the last `max_context` tokens (the model's activations are sized for
// it). Returns only the new ids.
std::vector<int32_t> generate(ModelRunner& runner, std::vector<int32_t> prompt, int max_context,
                              const SamplingOptions& options);

// Draws one id from logits[0..vocab) with temperature and top-k (exposed for tests).
int32_t sample_from_logits(std::vector<float>& logits, float temperature, int top_k, Rng& rng);

}  // namespace shardlm
