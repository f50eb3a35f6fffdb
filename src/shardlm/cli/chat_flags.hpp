// The generation flags `chat` and `sample` share: --max-new-tokens (sample: --tokens),
// --temperature, --top-k, --top-p, --seed, --max-context.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "shardlm/model/config.hpp"
#include "shardlm/train/sampling.hpp"

namespace shardlm::cli {

struct GenerationFlags {
  int max_new_tokens = 512;
  float temperature = 0.7f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 1;
  int max_context = 0;  // 0: min(the model's context, 4096)
  std::string tokens_flag = "--max-new-tokens";  // what the command calls max_new_tokens
};

// tokens_flag: the name of the reply-length flag ("--max-new-tokens", sample's "--tokens").
void add_generation_flags(CLI::App& cmd, GenerationFlags& flags,
                          const std::string& tokens_flag = "--max-new-tokens");
// Error naming the flag for a value out of range.
void check_generation_flags(const GenerationFlags& flags);
// The positions the KV cache holds: --max-context, checked against the model's.
int generation_context(const GenerationFlags& flags, const ModelConfig& config);
SamplingOptions sampling_options(const GenerationFlags& flags);
// "greedy" or "temperature 0.7, top-k 20, top-p 0.9, seed 1".
std::string describe_sampling(const GenerationFlags& flags);

}  // namespace shardlm::cli
