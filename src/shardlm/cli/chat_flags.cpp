#include "shardlm/cli/chat_flags.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "shardlm/core/error.hpp"

namespace shardlm::cli {

void add_generation_flags(CLI::App& cmd, GenerationFlags& flags, const std::string& tokens_flag) {
  flags.tokens_flag = tokens_flag;
  cmd.add_option(tokens_flag, flags.max_new_tokens, "Most tokens generated per reply (>= 1)")
      ->capture_default_str();
  cmd.add_option("--temperature", flags.temperature, "Softmax temperature (0: greedy)")
      ->capture_default_str();
  cmd.add_option("--top-k", flags.top_k, "Sample among the k likeliest (0: all)")
      ->capture_default_str();
  cmd.add_option("--top-p", flags.top_p,
                 "Sample among the likeliest whose probabilities reach p (1: all)")
      ->capture_default_str();
  cmd.add_option("--seed", flags.seed, "Sampling seed")->capture_default_str();
  cmd.add_option("--max-context", flags.max_context,
                 "Positions the KV cache holds (default: the model's context, at most 4096)");
}

void check_generation_flags(const GenerationFlags& f) {
  SHARDLM_CHECK(f.max_new_tokens >= 1, "{} must be >= 1, got {}", f.tokens_flag, f.max_new_tokens);
  SHARDLM_CHECK(std::isfinite(f.temperature) && f.temperature >= 0,
                "--temperature must be a finite number >= 0 (0: greedy), got {}", f.temperature);
  SHARDLM_CHECK(f.top_k >= 0, "--top-k must be >= 0 (0: all), got {}", f.top_k);
  SHARDLM_CHECK(std::isfinite(f.top_p) && f.top_p > 0 && f.top_p <= 1,
                "--top-p must be in (0, 1] (1: all), got {}", f.top_p);
  SHARDLM_CHECK(f.max_context >= 0, "--max-context must be >= 1, got {}", f.max_context);
}

int generation_context(const GenerationFlags& f, const ModelConfig& config) {
  if (f.max_context == 0) return std::min(config.max_seq_len, 4096);
  SHARDLM_CHECK(f.max_context <= config.max_seq_len,
                "--max-context {} is longer than the model's context ({})", f.max_context,
                config.max_seq_len);
  return f.max_context;
}

SamplingOptions sampling_options(const GenerationFlags& f) {
  SamplingOptions s;
  s.num_tokens = f.max_new_tokens;
  s.temperature = f.temperature;
  s.top_k = f.top_k;
  s.top_p = f.top_p;
  s.seed = f.seed;
  return s;
}

std::string describe_sampling(const GenerationFlags& f) {
  if (f.temperature <= 0) return "greedy";
  return fmt::format("temperature {}, top-k {}, top-p {}, seed {}", f.temperature,
                     f.top_k == 0 ? std::string("all") : std::to_string(f.top_k), f.top_p,
                     f.seed);
}

}  // namespace shardlm::cli
