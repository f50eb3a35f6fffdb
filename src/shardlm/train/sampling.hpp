// Autoregressive generation: temperature, top-k and top-p (nucleus) sampling, stop
// tokens, tokens streamed as they come, and a KV cache (Generator) so that each new
// token runs through the model once (docs/generation.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "shardlm/core/rng.hpp"
#include "shardlm/model/kv_cache.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

struct SamplingOptions {
  int num_tokens = 100;
  float temperature = 1.0f;  // <= 0: greedy
  int top_k = 0;             // 0: whole vocabulary
  float top_p = 1.0f;        // keep the likeliest ids whose probabilities reach top_p (1: all)
  uint64_t seed = 1;
  // Generation ends right after one of these ids (returned with the others).
  std::vector<int32_t> stop_ids;
};

// Called with each new id as soon as it is drawn (streaming to a terminal).
using TokenCallback = std::function<void(int32_t)>;

// One sequence run through the model with a KV cache of `capacity` positions (at most
// the max_seq the model was built for): feed() appends tokens and returns the logits
// after the last one.
class Generator {
 public:
  Generator(ModelRunner& runner, int capacity);

  // Appends `tokens` (at least one; at most room()) and returns the next-token logits.
  const std::vector<float>& feed(std::span<const int32_t> tokens);
  // Makes the sequence `tokens`: keeps the cached positions that are a prefix of it and
  // feeds the rest (a chat's next turn re-renders the conversation; only the new part
  // runs). tokens must extend past the kept prefix by at least one token.
  const std::vector<float>& feed_sequence(std::span<const int32_t> tokens);
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int capacity() const { return cache_.capacity(); }
  int room() const { return cache_.room(); }
  void reset();

 private:
  ModelRunner& runner_;
  KvCache cache_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
};

// Extends `prompt` (token ids, at least one) by up to num_tokens ids, stopping after a
// stop id, with a KV cache. The model sees at most `max_context` tokens (its
// activations and the cache are sized for it): when the context is full, the cache
// restarts on the context's last half. Returns only the new ids. A model on a device
// (no KV-cache kernel there yet) reruns the context (generate_without_cache).
std::vector<int32_t> generate(ModelRunner& runner, std::vector<int32_t> prompt, int max_context,
                              const SamplingOptions& options, const TokenCallback& on_token = {});
// The same by rerunning the whole context (its last max_context tokens) for every
// token: the reference the KV cache is tested against.
std::vector<int32_t> generate_without_cache(ModelRunner& runner, std::vector<int32_t> prompt,
                                            int max_context, const SamplingOptions& options);

// Draws one id from logits[0..vocab) with temperature, top-k and top-p (exposed for tests).
int32_t sample_from_logits(std::vector<float>& logits, float temperature, int top_k, Rng& rng,
                           float top_p = 1.0f);

}  // namespace shardlm
