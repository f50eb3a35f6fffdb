#include <omp.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <memory>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/train/loaded_model.hpp"
#include "shardlm/train/sampling.hpp"

namespace shardlm::cli {

namespace {
struct SampleArgs {
  std::string checkpoint;
  std::string prompt = "\n";
  SamplingOptions sampling{100, 0.8f, 40, 1};
  std::optional<int> threads;
};
}  // namespace

void register_sample(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint directory or run directory")
      ->required();
  cmd->add_option("--prompt", args->prompt, "Text to continue");
  cmd->add_option("--tokens", args->sampling.num_tokens, "Tokens to generate (>= 1)")
      ->capture_default_str();
  cmd->add_option("--temperature", args->sampling.temperature, "Softmax temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", args->sampling.top_k, "Sample among the k likeliest (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", args->sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (default: all cores)");
  cmd->callback([args]() {
    const SamplingOptions& s = args->sampling;
    SHARDLM_CHECK(s.num_tokens >= 1, "--tokens must be >= 1, got {}", s.num_tokens);
    SHARDLM_CHECK(std::isfinite(s.temperature) && s.temperature >= 0,
                  "--temperature must be a finite number >= 0 (0: greedy), got {}", s.temperature);
    SHARDLM_CHECK(s.top_k >= 0, "--top-k must be >= 0 (0: all), got {}", s.top_k);
    apply_threads_flag(args->threads);
    const auto opened = open_checkpoint(args->checkpoint, print_checkpoint_warning);
    const CheckpointReader& ckpt = *opened;
    const ModelConfig& config = ckpt.info().model;
    auto tokenizer = make_tokenizer(ckpt.info().tokenizer);
    LoadedModel loaded(ckpt, 1, config.max_seq_len);
    std::vector<int32_t> prompt = tokenizer->encode(args->prompt);
    if (prompt.empty()) prompt.push_back(tokenizer->end_of_text().value_or(0));
    auto ids = generate(loaded.runner(), prompt, config.max_seq_len, args->sampling);
    std::printf("%s%s\n", args->prompt.c_str(), tokenizer->decode(ids).c_str());
  });
}

}  // namespace shardlm::cli
