// `shardlm sft`: supervised fine-tuning on chat data in one command, as ms-swift's
// `swift sft` reads: --model (a Hugging Face directory, whose weights and tokenizer
// are used, or a preset), --dataset JSONL, --out RUN. Underneath it is `prepare --sft`
// into RUN/data (on rank 0, once, under the run directory's lock, committed whole by a
// rename; a later --resume checks it was made from the same files the same way) and
// then `train` on it, so every train flag (strategy,
// precision, LoRA/QLoRA, checkpoints, ...) applies unchanged.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/cli/chat_template_flags.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/config_file.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sft_prepare.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/plan/auto_strategy.hpp"
#include "shardlm/train/run_directory.hpp"
#include "shardlm/train/train_options.hpp"
#include "shardlm/train/trainer.hpp"

namespace fs = std::filesystem;

namespace shardlm::cli {
namespace {

struct SftFlags {
  std::vector<std::string> datasets, val_datasets;
  std::string tokenizer;
  std::string chat_template;
  std::string enable_thinking;  // "", "true" or "false"
  std::string template_date;
  double val_fraction = 0.0;
  int64_t max_len = 1024;
  bool no_truncate = false;
};

bool has_hf_weights(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "model.safetensors") ||
         fs::is_regular_file(fs::path(dir) / "model.safetensors.index.json");
}

// config.json's dtype ("torch_dtype"; "dtype" in newer transformers); "" when absent.
std::string hf_torch_dtype(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "config.json");
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return "";
  for (const char* key : {"torch_dtype", "dtype"})
    if (config.contains(key) && config[key].is_string()) return config[key].get<std::string>();
  return "";
}

// A directory written earlier for this run must hold what this command would write.
void check_prepared_matches(const std::string& dir, const SftPrepareOptions& want) {
  const SftDatasetMeta meta = read_sft_dataset_meta(dir);
  auto differs = [&](const std::string& what, const std::string& was, const std::string& now) {
    throw Error(fmt::format("{} was prepared with {} '{}', this command asks for '{}': use a new "
                            "--out (a run's data never changes under its checkpoints)",
                            dir, what, was, now));
  };
  const std::string tokenizer = make_tokenizer(want.tokenizer)->spec();  // as prepare records it
  if (meta.tokenizer != tokenizer) differs("tokenizer", meta.tokenizer, tokenizer);
  const std::string chat_template = sft_chat_template_id(want);
  if (meta.chat_template != chat_template) differs("template", meta.chat_template, chat_template);
  const std::string max_len = meta.max_len ? std::to_string(*meta.max_len) : "none";
  if (max_len != std::to_string(want.max_len)) differs("--max-len", max_len, std::to_string(want.max_len));
  std::vector<std::string> files = want.inputs;
  files.insert(files.end(), want.val_inputs.begin(), want.val_inputs.end());
  SHARDLM_CHECK(files.size() == meta.sources.size(),
                "{} was prepared from {} dataset file(s), this command names {}: use a new --out",
                dir, meta.sources.size(), files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string digest = sha256_file_hex(files[i]);
    if (digest != meta.sources[i].sha256)
      differs("dataset file", meta.sources[i].path + " (sha256 " + meta.sources[i].sha256.substr(0, 12) + ")",
              fs::absolute(files[i]).string() + " (sha256 " + digest.substr(0, 12) + ")");
  }
}

}  // namespace

void register_sft(CLI::App& app) {
  auto opts = std::make_shared<TrainOptions>();
  auto flags = std::make_shared<SftFlags>();
  auto* cmd = app.add_subcommand(
      "sft", "Fine-tune on chat data (JSONL) in one command: prepare --sft into RUN/data, then train");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--dataset", flags->datasets,
                  "Training data, JSONL: {\"messages\": [...]}, {\"query\"|\"prompt\", \"response\"} or "
                  "alpaca {\"instruction\", \"input\", \"output\"}")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--val-dataset", flags->val_datasets, "Validation data, JSONL (same formats)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--val-fraction", flags->val_fraction,
                  "Without --val-dataset: the last fraction of the examples held out")
      ->capture_default_str();
  cmd->add_option("--out", opts->out_dir, "Run directory (data/, metrics, checkpoints)")->required();
  cmd->add_option("--tokenizer", flags->tokenizer,
                  "Tokenizer spec (as prepare's); default: the --model directory's tokenizer.json");
  add_chat_template_flags(*cmd, flags->chat_template, flags->enable_thinking, flags->template_date);
  cmd->add_option("--max-len", flags->max_len,
                  "Tokens per row: longer examples are truncated (counted in the summary) and "
                  "--packing fills rows up to it")
      ->capture_default_str();
  cmd->add_flag("--no-truncate", flags->no_truncate, "An example longer than --max-len is an error");
  add_run_shape_flags(*cmd, *opts);
  add_run_flags(*cmd, *opts);
  // The row length is --max-len: --seq-len stays as a flag only to say so.
  cmd->get_option("--seq-len")->description("Not for sft: the row length is --max-len")->default_str("");
  cmd->get_option("--lr")
      ->description("Peak learning rate (default: 1e-4 with --lora-rank, else 1e-5)")
      ->default_str("");
  cmd->get_option("--steps")
      ->description("Optimizer steps (default: one epoch, as --epochs 1; the start line says how many)")
      ->default_str("");
  cmd->get_option("--packing")
      ->description("Pack whole examples into each --max-len row (attention and positions restart per "
                    "example) instead of one padded example per row");
  cmd->get_option("--precision")
      ->description("Compute type: fp32, bf16 or fp16 (default: bf16 when the --model directory's "
                    "config.json says torch_dtype bfloat16, as ms-swift trains, else fp32)")
      ->default_str("");
  add_config_flag(*cmd);
  cmd->callback([opts, flags, cmd]() {
    resolve_tensorboard_flag(*cmd, *opts);
    opts->command = "sft";
    opts->command_flags = command_flags(*cmd);
    SHARDLM_CHECK(cmd->count("--seq-len") == 0, "sft: the row length is --max-len (no --seq-len)");
    SHARDLM_CHECK(flags->max_len >= 2, "--max-len must be >= 2, got {}", flags->max_len);
    SHARDLM_CHECK(!opts->model.empty(), "sft: --model is required (a Hugging Face model directory or a preset)");
    const bool model_dir = is_hf_model_path(opts->model) && fs::is_directory(opts->model);
    // A model directory brings its weights (unless this run resumes from its own
    // checkpoint) and its tokenizer.
    if (model_dir && has_hf_weights(opts->model) && opts->init_from.empty() && !opts->resume)
      opts->init_from = opts->model;
    if (!model_dir) {  // a preset, or named as what it is not (e.g. a hub id) before anything else
      TrainOptions preset_only;
      preset_only.model = opts->model;
      preset_only.seq_len = 1;
      resolve_model_config(preset_only, std::nullopt);
    }
    if (flags->tokenizer.empty()) {
      SHARDLM_CHECK(model_dir && fs::is_regular_file(fs::path(opts->model) / "tokenizer.json"),
                    "sft: --model '{}' brings no tokenizer.json; name one with --tokenizer (hf:DIR, "
                    "tiktoken:qwen:FILE, gpt2:DIR)",
                    opts->model);
      flags->tokenizer = "hf:" + fs::absolute(opts->model).string();
    }
    // Every input is checked before anything under --out is written: the model (a local
    // directory or a preset), --max-len against its context, the tokenizer against its
    // vocabulary (the prepared data's is checked again once it exists).
    TrainOptions shape_only = *opts;
    shape_only.seq_len = 1;
    const ModelConfig model = resolve_model_config(shape_only, std::nullopt);
    SHARDLM_CHECK(flags->max_len <= model.max_seq_len,
                  "--max-len {} is longer than the model's context ({} positions; --context-len sets it)",
                  flags->max_len, model.max_seq_len);
    const bool vocabulary_follows_data =
        !is_hf_model_path(model_source(*opts)) && preset_vocabulary_follows_data(model_source(*opts));
    if (!vocabulary_follows_data || opts->vocab_size) {
      const int tokenizer_vocab = make_tokenizer(flags->tokenizer)->vocab_size();
      SHARDLM_CHECK(tokenizer_vocab <= model.vocab_size,
                    "the tokenizer '{}' has {} tokens, more than the model's vocabulary ({}{}): use the "
                    "model's own tokenizer",
                    flags->tokenizer, tokenizer_vocab, model.vocab_size,
                    opts->vocab_size ? " from --vocab-size" : "");
    }
    if (cmd->count("--precision") == 0 && model_dir && hf_torch_dtype(opts->model) == "bfloat16") {
      opts->precision = "bf16";
      opts->precision_reason = "the model's torch_dtype, bfloat16; --precision fp32 to change";
    }
    opts->seq_len = static_cast<int>(flags->max_len);
    if (cmd->count("--steps") == 0 && opts->epochs == 0) opts->epochs = 1;
    // ms-swift's defaults: 1e-4 for adapters, 1e-5 for every weight.
    if (cmd->count("--lr") == 0) opts->lr = opts->lora_rank > 0 ? 1e-4f : 1e-5f;
    opts->data_dir = (fs::path(opts->out_dir) / "data").string();
    // The model and the weights it imports are checked before the data is prepared
    // (the model's own vocabulary: the data's is checked against it once prepared).
    if (!opts->init_from.empty())
      check_hf_model_matches(opts->init_from, resolve_model_config(*opts, std::nullopt));

    SftPrepareOptions prepare;
    prepare.tokenizer = flags->tokenizer;
    prepare.chat_template = flags->chat_template;
    prepare.enable_thinking = parse_enable_thinking(flags->enable_thinking);
    prepare.template_date = flags->template_date;
    prepare.inputs = flags->datasets;
    prepare.val_inputs = flags->val_datasets;
    prepare.out_dir = opts->data_dir;
    prepare.val_fraction = flags->val_fraction;
    prepare.max_len = flags->max_len;
    prepare.truncate = !flags->no_truncate;
    opts->validate();
    const RunSetup setup{.prepare_data = [prepare]() {
      if (is_sft_dataset(prepare.out_dir)) {
        check_prepared_matches(prepare.out_dir, prepare);
        return;
      }
      SHARDLM_CHECK(!fs::exists(dataset_meta_path(prepare.out_dir)),
                    "{} holds a text dataset, not chat data: use a new --out", prepare.out_dir);
      SftPrepareSummary s;
      write_run_data(prepare.out_dir, [&](const std::string& temporary_dir) {  // whole or not at all
        SftPrepareOptions into = prepare;
        into.out_dir = temporary_dir;
        s = prepare_sft_dataset(into);
      });
      fmt::print("prepared {}: {} train examples ({} tokens, {} targets) + {} val examples, template {}, "
                 "{} truncated to --max-len {}, {} dropped (no target left)\n",
                 prepare.out_dir, s.meta.train.examples, s.meta.train.tokens, s.meta.train.target_tokens,
                 s.meta.val.examples, s.meta.chat_template, s.meta.truncated_examples, prepare.max_len,
                 s.meta.dropped_examples);
      std::fflush(stdout);
    }, .resolve_options = resolve_auto_strategy};
    const TrainSummary summary = run_training(*opts, setup);
    print_summary(summary);
    exit_if_stopped(summary);
  });
}

}  // namespace shardlm::cli
