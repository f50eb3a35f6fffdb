#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "shardlm/cli/commands.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/prepare.hpp"

namespace shardlm::cli {

void register_prepare(CLI::App& app) {
  auto opts = std::make_shared<PrepareOptions>();
  auto* cmd = app.add_subcommand("prepare", "Tokenize text files into train/val token files");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "byte, gpt2:DIR (vocab.json + merges.txt), a Hugging Face tokenizer directory (DIR or hf:DIR "
                  "with tokenizer.json), or tiktoken:[qwen:]FILE (a tiktoken rank file)")
      ->required();
  cmd->add_option("--input", opts->inputs, "Text files, concatenated in order")->required();
  cmd->add_option("--out", opts->out_dir, "Output directory")->required();
  cmd->add_option("--val-fraction", opts->val_fraction, "Last fraction of tokens held out")
      ->capture_default_str();
  cmd->callback([opts]() {
    // Replacing the token files under a run that trained on them would change what its
    // checkpoints mean; a new dataset goes to a new directory.
    for (const std::string& file : {dataset_meta_path(opts->out_dir),
                                    dataset_train_path(opts->out_dir),
                                    dataset_val_path(opts->out_dir)})
      SHARDLM_CHECK(!std::filesystem::exists(file),
                    "--out '{}' already holds a prepared dataset ('{}'); prepare never replaces "
                    "one: choose another --out or remove it",
                    opts->out_dir, file);
    PrepareSummary s = prepare_dataset(*opts);
    fmt::print("prepared {}: {} train + {} val tokens (vocab {}, tokenizer {}) in {:.1f} s\n",
               opts->out_dir, s.meta.train_tokens, s.meta.val_tokens, s.meta.vocab_size,
               s.meta.tokenizer, s.seconds);
  });
}

}  // namespace shardlm::cli
