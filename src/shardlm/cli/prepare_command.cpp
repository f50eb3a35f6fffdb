#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "shardlm/cli/chat_template_flags.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sft_prepare.hpp"

namespace shardlm::cli {
namespace {

struct PrepareFlags {
  PrepareOptions text;
  bool sft = false;
  std::string chat_template;
  std::string enable_thinking;
  std::string template_date;
  std::vector<std::string> val_inputs;
  int64_t max_len = 0;
  bool no_truncate = false;
};

void prepare_sft(const PrepareFlags& flags, CLI::App& cmd) {
  SftPrepareOptions options;
  options.tokenizer = flags.text.tokenizer;
  options.chat_template = flags.chat_template;
  options.enable_thinking = parse_enable_thinking(flags.enable_thinking);
  options.template_date = flags.template_date;
  options.inputs = flags.text.inputs;
  options.val_inputs = flags.val_inputs;
  options.out_dir = flags.text.out_dir;
  // Text's default val fraction would clash with --val-input; with --sft it is 0 unless given.
  options.val_fraction = cmd.count("--val-fraction") > 0 ? flags.text.val_fraction : 0.0;
  options.max_len = flags.max_len;
  options.truncate = !flags.no_truncate;
  const SftPrepareSummary s = prepare_sft_dataset(options);
  fmt::print("prepared {}: {} train examples ({} tokens, {} targets) + {} val examples ({} tokens), template {}, "
             "{} truncated to --max-len, {} dropped (no target left), tokenizer {} in {:.1f} s\n",
             options.out_dir, s.meta.train.examples, s.meta.train.tokens, s.meta.train.target_tokens,
             s.meta.val.examples, s.meta.val.tokens, s.meta.chat_template, s.meta.truncated_examples,
             s.meta.dropped_examples, s.meta.tokenizer, s.seconds);
}

}  // namespace

void register_prepare(CLI::App& app) {
  auto flags = std::make_shared<PrepareFlags>();
  auto* cmd = app.add_subcommand("prepare", "Tokenize text files (or, with --sft, chat datasets) into a dataset");
  cmd->add_option("--tokenizer", flags->text.tokenizer,
                  "byte, gpt2:DIR (vocab.json + merges.txt), a Hugging Face tokenizer directory (DIR or hf:DIR "
                  "with tokenizer.json), or tiktoken:[qwen:]FILE (a tiktoken rank file)")
      ->required();
  cmd->add_option("--input", flags->text.inputs, "Text files, concatenated in order (JSONL datasets with --sft)")
      ->required();
  cmd->add_option("--out", flags->text.out_dir, "Output directory")->required();
  cmd->add_option("--val-fraction", flags->text.val_fraction,
                  "Last fraction of tokens held out (with --sft: of examples, default 0)")
      ->capture_default_str();
  cmd->add_flag("--sft", flags->sft,
                "Chat/instruction datasets (JSONL: messages, query/prompt + response, or alpaca) rendered with a "
                "chat template into train.sft/val.sft with loss masks");
  add_chat_template_flags(*cmd, flags->chat_template, flags->enable_thinking, flags->template_date);
  cmd->add_option("--val-input", flags->val_inputs, "With --sft: JSONL datasets for val.sft");
  cmd->add_option("--max-len", flags->max_len, "With --sft: examples longer than this many tokens are cut to it");
  cmd->add_flag("--no-truncate", flags->no_truncate, "With --sft: an example longer than --max-len is an error");
  cmd->callback([flags, cmd]() {
    const std::string& out = flags->text.out_dir;
    // Replacing the files under a run that trained on them would change what its
    // checkpoints mean; a new dataset goes to a new directory.
    for (const std::string& file : {dataset_meta_path(out), dataset_train_path(out), dataset_val_path(out),
                                    sft_train_path(out), sft_val_path(out)})
      SHARDLM_CHECK(!std::filesystem::exists(file),
                    "--out '{}' already holds a prepared dataset ('{}'); prepare never replaces "
                    "one: choose another --out or remove it",
                    out, file);
    if (flags->sft) {
      prepare_sft(*flags, *cmd);
      return;
    }
    for (const char* flag : {"--template", "--enable-thinking", "--template-date", "--val-input", "--max-len", "--no-truncate"})
      SHARDLM_CHECK(cmd->count(flag) == 0, "prepare: {} applies to chat datasets only (add --sft)", flag);
    PrepareSummary s = prepare_dataset(flags->text);
    fmt::print("prepared {}: {} train + {} val tokens (vocab {}, tokenizer {}) in {:.1f} s\n",
               out, s.meta.train_tokens, s.meta.val_tokens, s.meta.vocab_size,
               s.meta.tokenizer, s.seconds);
  });
}

}  // namespace shardlm::cli
