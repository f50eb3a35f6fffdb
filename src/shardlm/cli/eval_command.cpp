#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/train/loaded_model.hpp"

namespace shardlm::cli {

namespace {
struct EvalArgs {
  std::string checkpoint;
  std::string data;
  std::string split = "val";
  int seq_len = 256;
  int windows = 32;
  int micro_batch = 4;
  std::optional<int> threads;
};
}  // namespace

void register_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand(
      "eval", "Mean cross-entropy of a checkpoint on the first windows of a token file");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint directory or run directory")
      ->required();
  cmd->add_option("--data", args->data, "Directory written by `shardlm prepare`")->required();
  cmd->add_option("--split", args->split, "val or train")->capture_default_str();
  cmd->add_option("--seq-len", args->seq_len, "Tokens per window")->capture_default_str();
  cmd->add_option("--windows", args->windows, "Windows evaluated, from the start of the file")
      ->capture_default_str();
  cmd->add_option("--micro-batch", args->micro_batch, "Windows per forward pass")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (default: all cores)");
  cmd->callback([args]() {
    SHARDLM_CHECK(args->split == "val" || args->split == "train",
                  "--split must be val or train, got '{}'", args->split);
    for (const auto& [flag, value] : {std::pair{"--windows", args->windows},
                                      std::pair{"--micro-batch", args->micro_batch},
                                      std::pair{"--seq-len", args->seq_len}})
      SHARDLM_CHECK(value >= 1, "{} must be >= 1, got {}", flag, value);
    apply_threads_flag(args->threads);
    const DatasetMeta meta = read_dataset_meta(args->data);
    const auto opened = open_checkpoint(args->checkpoint, print_checkpoint_warning);
    const CheckpointReader& ckpt = *opened;
    const ModelConfig& config = ckpt.info().model;
    // Token ids mean nothing under another tokenizer, though they may fit the vocabulary.
    SHARDLM_CHECK(meta.tokenizer == ckpt.info().tokenizer,
                  "--data '{}' was tokenized with '{}', but checkpoint '{}' was trained with '{}' "
                  "(prepare the text with that tokenizer)",
                  args->data, meta.tokenizer, ckpt.dir(), ckpt.info().tokenizer);
    SHARDLM_CHECK(args->seq_len <= config.max_seq_len,
                  "--seq-len {} is longer than the model's context ({})", args->seq_len,
                  config.max_seq_len);
    TokenFile tokens(args->split == "val" ? dataset_val_path(args->data)
                                          : dataset_train_path(args->data));
    SHARDLM_CHECK(tokens.vocab_size() <= config.vocab_size,
                  "'{}' has vocabulary {}, larger than the model's {}", tokens.path(),
                  tokens.vocab_size(), config.vocab_size);
    EvalSampler sampler(tokens, args->seq_len);
    const int64_t windows = std::min<int64_t>(args->windows, sampler.num_windows());
    LoadedModel loaded(ckpt, args->micro_batch, args->seq_len);
    const size_t window_tokens = static_cast<size_t>(args->seq_len);
    std::vector<int32_t> in(window_tokens * static_cast<size_t>(args->micro_batch));
    std::vector<int32_t> target(in.size());
    double loss_sum = 0.0;
    int64_t count = 0;
    for (int64_t first = 0; first < windows; first += args->micro_batch) {
      const int rows = static_cast<int>(std::min<int64_t>(args->micro_batch, windows - first));
      for (int i = 0; i < rows; ++i)
        sampler.fill(first + i, in.data() + static_cast<size_t>(i) * window_tokens,
                     target.data() + static_cast<size_t>(i) * window_tokens);
      loss_sum += loaded.runner().forward({in.data(), target.data(), rows, args->seq_len}, false, 0.0f);
      count += loaded.model().last_target_count();
    }
    fmt::print("windows: {}\ntokens: {}\nloss: {:.8f}\n", windows, count,
               loss_sum / static_cast<double>(count));
  });
}

}  // namespace shardlm::cli
