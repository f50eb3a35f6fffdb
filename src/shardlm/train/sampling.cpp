#include "shardlm/train/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shardlm/core/error.hpp"

namespace shardlm {

int32_t sample_from_logits(std::vector<float>& logits, float temperature, int top_k, Rng& rng) {
  const int vocab = static_cast<int>(logits.size());
  if (temperature <= 0.0f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  int keep = (top_k > 0 && top_k < vocab) ? top_k : vocab;
  // Ties broken by id so the draw is deterministic.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] != logits[static_cast<size_t>(b)]
               ? logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]
               : a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  const double max_logit = logits[static_cast<size_t>(ids[0])];
  std::vector<double> weights(static_cast<size_t>(keep));
  double total = 0.0;
  for (int i = 0; i < keep; ++i) {
    weights[static_cast<size_t>(i)] =
        std::exp((logits[static_cast<size_t>(ids[static_cast<size_t>(i)])] - max_logit) / temperature);
    total += weights[static_cast<size_t>(i)];
  }
  double r = rng.uniform() * total;
  for (int i = 0; i < keep; ++i) {
    r -= weights[static_cast<size_t>(i)];
    if (r < 0.0) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(keep - 1)];
}

std::vector<int32_t> generate(ModelRunner& runner, std::vector<int32_t> prompt, int max_context,
                              const SamplingOptions& options) {
  SHARDLM_CHECK(!prompt.empty(), "the sampling prompt is empty (expected at least one token)");
  SHARDLM_CHECK(max_context > 0, "sampling context must be positive, got {}", max_context);
  const int vocab = runner.model().config().vocab_size;
  for (int32_t id : prompt)
    SHARDLM_CHECK(id >= 0 && id < vocab, "prompt token id {} is outside the vocabulary [0, {})",
                  id, vocab);
  Rng rng(options.seed);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> generated;
  for (int i = 0; i < options.num_tokens; ++i) {
    const int T = std::min<int>(static_cast<int>(prompt.size()), max_context);
    MicroBatch batch{prompt.data() + (prompt.size() - static_cast<size_t>(T)), nullptr, 1, T};
    runner.forward(batch, /*training=*/false, 0.0f);
    runner.model().logits_at(runner.strategy().params(), T - 1, logits.data());
    int32_t next = sample_from_logits(logits, options.temperature, options.top_k, rng);
    prompt.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

}  // namespace shardlm
