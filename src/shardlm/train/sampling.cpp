#include "shardlm/train/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shardlm/core/error.hpp"

namespace shardlm {

int32_t sample_from_logits(std::vector<float>& logits, float temperature, int top_k, Rng& rng,
                           float top_p) {
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
  if (top_p < 1.0f) {
    // The likeliest ids (in order) until their share of the probability reaches top_p.
    double kept = 0.0;
    int n = 0;
    while (n < keep && (n == 0 || kept < top_p * total)) kept += weights[static_cast<size_t>(n++)];
    keep = n;
    total = kept;
  }
  double r = rng.uniform() * total;
  for (int i = 0; i < keep; ++i) {
    r -= weights[static_cast<size_t>(i)];
    if (r < 0.0) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(keep - 1)];
}

Generator::Generator(ModelRunner& runner, int capacity)
    : runner_(runner),
      cache_(runner.model().make_kv_cache(capacity)),
      logits_(static_cast<size_t>(runner.model().config().vocab_size)) {}

const std::vector<float>& Generator::feed(std::span<const int32_t> tokens) {
  SHARDLM_CHECK(!tokens.empty(), "generation: nothing to feed (expected at least one token)");
  SHARDLM_CHECK(static_cast<int>(tokens.size()) <= cache_.room(),
                "generation: {} tokens do not fit the context ({} of {} positions used)",
                tokens.size(), cache_.length(), cache_.capacity());
  const int vocab = runner_.model().config().vocab_size;
  for (int32_t id : tokens)
    SHARDLM_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary [0, {})", id,
                  vocab);
  const int T = static_cast<int>(tokens.size());
  MicroBatch batch{tokens.data(), nullptr, 1, T};
  runner_.forward_cached(batch, cache_, logits_.data());
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return logits_;
}

const std::vector<float>& Generator::feed_sequence(std::span<const int32_t> tokens) {
  size_t common = 0;
  while (common < tokens_.size() && common < tokens.size() && tokens_[common] == tokens[common])
    ++common;
  // The last token must run again to give its logits.
  if (common == tokens.size()) --common;
  if (common < tokens_.size()) {
    // Dropping positions from the end of a cache is truncating it: refeed from scratch
    // when the kept prefix is not the whole cache (simple; turns only ever extend).
    reset();
    common = 0;
  }
  return feed(tokens.subspan(common));
}

void Generator::reset() {
  cache_.clear();
  tokens_.clear();
}

namespace {

void check_prompt(const std::vector<int32_t>& prompt, int max_context, int vocab) {
  SHARDLM_CHECK(!prompt.empty(), "the sampling prompt is empty (expected at least one token)");
  SHARDLM_CHECK(max_context > 0, "sampling context must be positive, got {}", max_context);
  for (int32_t id : prompt)
    SHARDLM_CHECK(id >= 0 && id < vocab, "prompt token id {} is outside the vocabulary [0, {})",
                  id, vocab);
}

bool is_stop(const SamplingOptions& options, int32_t id) {
  return std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end();
}

}  // namespace

std::vector<int32_t> generate(ModelRunner& runner, std::vector<int32_t> prompt, int max_context,
                              const SamplingOptions& options, const TokenCallback& on_token) {
  check_prompt(prompt, max_context, runner.model().config().vocab_size);
  // Generation with the KV cache is tested end to end on the CPU only: on a device it
  // reruns the context (the CUDA backend's attention_forward_cached exists and is checked
  // as host fibers and by test_backend_ops on a card, but the cached model path has not
  // run on one).
  if (!runner.model().options().device.is_host()) {
    auto ids = generate_without_cache(runner, std::move(prompt), max_context, options);
    if (on_token)
      for (int32_t id : ids) on_token(id);
    return ids;
  }
  Rng rng(options.seed);
  Generator generator(runner, max_context);
  std::vector<float> logits;
  {
    const size_t T = std::min<size_t>(prompt.size(), static_cast<size_t>(max_context));
    logits = generator.feed(std::span<const int32_t>(prompt).last(T));
  }
  std::vector<int32_t> generated;
  for (int i = 0; i < options.num_tokens; ++i) {
    const int32_t next =
        sample_from_logits(logits, options.temperature, options.top_k, rng, options.top_p);
    prompt.push_back(next);
    generated.push_back(next);
    if (on_token) on_token(next);
    if (is_stop(options, next) || i + 1 == options.num_tokens) break;
    if (generator.room() == 0) {
      generator.reset();
      const size_t keep = std::max<size_t>(1, static_cast<size_t>(max_context) / 2);
      logits = generator.feed(std::span<const int32_t>(prompt).last(keep));
    } else {
      logits = generator.feed(std::span<const int32_t>(&prompt.back(), 1));
    }
  }
  return generated;
}

std::vector<int32_t> generate_without_cache(ModelRunner& runner, std::vector<int32_t> prompt,
                                            int max_context, const SamplingOptions& options) {
  const int vocab = runner.model().config().vocab_size;
  check_prompt(prompt, max_context, vocab);
  Rng rng(options.seed);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> generated;
  for (int i = 0; i < options.num_tokens; ++i) {
    const int T = std::min<int>(static_cast<int>(prompt.size()), max_context);
    MicroBatch batch{prompt.data() + (prompt.size() - static_cast<size_t>(T)), nullptr, 1, T};
    runner.forward(batch, /*training=*/false, 0.0f, logits.data());
    const int32_t next =
        sample_from_logits(logits, options.temperature, options.top_k, rng, options.top_p);
    prompt.push_back(next);
    generated.push_back(next);
    if (is_stop(options, next)) break;
  }
  return generated;
}

}  // namespace shardlm
