// `shardlm eval`: the mean cross-entropy of a model on a dataset's validation split
// (a text dataset's windows or an SFT dataset's conversations, the whole split unless
// --windows says fewer), or --task gsm8k: generated answers to GSM8K questions scored
// by exact match of the final number (train/gsm8k.hpp, docs/generation.md).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "shardlm/cli/chat_flags.hpp"
#include "shardlm/cli/chat_template_flags.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/inference_model.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/dataset_meta_json.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/data/sft_prepare.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/train/batch_source.hpp"
#include "shardlm/train/chat_session.hpp"
#include "shardlm/train/evaluation.hpp"
#include "shardlm/train/gsm8k.hpp"

namespace shardlm::cli {

namespace {
struct EvalArgs {
  std::string checkpoint;
  std::string data;
  std::string task = "loss";
  std::string split = "val";
  std::optional<int> seq_len;
  std::optional<int64_t> windows;
  int micro_batch = 4;
  std::string output;
  GenerationFlags generation{.max_new_tokens = 256, .temperature = 0.0f};
  std::string chat_template, enable_thinking, template_date;
  std::optional<int> threads;
};

// The model's tokenizer as a dataset's meta.json names it.
std::string canonical_tokenizer(const InferenceModel& model) {
  return model.checkpoint ? model.tokenizer_spec : make_tokenizer(model.tokenizer_spec)->spec();
}

void check_tokenizer(const InferenceModel& model, const std::string& data, const std::string& data_tokenizer) {
  // Token ids mean nothing under another tokenizer, though they may fit the vocabulary.
  const std::string ours = canonical_tokenizer(model);
  SHARDLM_CHECK(data_tokenizer == ours,
                "--data '{}' was tokenized with '{}', but {} was trained with '{}' (prepare the "
                "text with that tokenizer)",
                data, data_tokenizer, model.source, ours);
}

// The loss over rows [0, rows), micro_batch rows per forward (the trainer's loop).
void print_loss(const char* unit, InferenceModel& model, const EvalRows& rows, const FillEvalRow& fill) {
  const EvalLoss loss = evaluate_rows(model.loaded->runner(), rows, fill);
  SHARDLM_CHECK(loss.target_count > 0, "the evaluated rows hold no target token");
  fmt::print("{}: {}\ntokens: {}\nloss: {:.8f}\n", unit, rows.rows, loss.target_count,
             loss.loss_sum / static_cast<double>(loss.target_count));
}

void eval_text(InferenceModel& model, const EvalArgs& args) {
  const int seq_len = args.seq_len.value_or(256);
  SHARDLM_CHECK(seq_len <= model.config.max_seq_len,
                "--seq-len {} is longer than the model's context ({})", seq_len,
                model.config.max_seq_len);
  TokenFile tokens(args.split == "val" ? dataset_val_path(args.data) : dataset_train_path(args.data));
  SHARDLM_CHECK(tokens.vocab_size() <= model.config.vocab_size,
                "'{}' has vocabulary {}, larger than the model's {}", tokens.path(),
                tokens.vocab_size(), model.config.vocab_size);
  EvalSampler sampler(tokens, seq_len);
  const int64_t windows = std::min<int64_t>(args.windows.value_or(sampler.num_windows()), sampler.num_windows());
  load_inference_model(model, "evaluate", args.micro_batch, seq_len);
  const int64_t window_tokens = seq_len;
  print_loss("windows", model, {.rows = windows, .micro_batch = args.micro_batch, .seq_len = seq_len},
             [&](int64_t row, const RowBuffers& out, int at) {
               sampler.fill(row, out.tokens + at * window_tokens, out.targets + at * window_tokens);
             });
}

// An SFT dataset's validation conversations, one padded row each (as sft's own
// validation reads them), loss over the assistant tokens.
void eval_sft(InferenceModel& model, const EvalArgs& args) {
  SHARDLM_CHECK(args.split == "val", "--split train is for text datasets; an SFT dataset is "
                "evaluated on its validation conversations");
  const SftDatasetMeta meta = read_sft_dataset_meta(args.data);
  const int seq_len = args.seq_len.value_or(static_cast<int>(
      std::min<int64_t>(meta.max_len.value_or(model.config.max_seq_len), model.config.max_seq_len)));
  SHARDLM_CHECK(seq_len >= 1 && seq_len <= model.config.max_seq_len,
                "--seq-len {} must be in [1, the model's context {}]", seq_len,
                model.config.max_seq_len);
  SHARDLM_CHECK(meta.vocab_size <= model.config.vocab_size,
                "--data '{}' has vocabulary {}, larger than the model's {}", args.data,
                meta.vocab_size, model.config.vocab_size);
  auto source = open_batch_source(args.data, {seq_len, 0, false});
  SHARDLM_CHECK(source->val_rows() > 0, "--data '{}' has no validation conversations (prepare "
                "it with a --val-fraction or val inputs)", args.data);
  const int64_t rows_total = std::min<int64_t>(args.windows.value_or(source->val_rows()), source->val_rows());
  load_inference_model(model, "evaluate", args.micro_batch, seq_len);
  print_loss("examples", model,
             {.rows = rows_total, .micro_batch = args.micro_batch, .seq_len = seq_len, .positions = true},
             [&](int64_t row, const RowBuffers& out, int at) { source->fill_val(row, out, at); });
}

struct Gsm8kQuestion {
  std::string question, response;
};

// Lines {"prompt", "response"} (shardlm's gsm8k_*.jsonl) or {"question", "answer"}
// (the Hugging Face dataset's), the response ending in "#### N".
std::vector<Gsm8kQuestion> read_gsm8k(const std::string& path, std::optional<int64_t> limit) {
  std::ifstream in(path);
  SHARDLM_CHECK(in.good() && !std::filesystem::is_directory(path),
                "--data '{}' cannot be read (expected a GSM8K JSONL file)", path);
  std::vector<Gsm8kQuestion> out;
  std::string text;
  for (int n = 1; std::getline(in, text) && (!limit || static_cast<int64_t>(out.size()) < *limit); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", path, n);
    nlohmann::json line;
    try {
      line = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: not JSON ({})", where, e.what()));
    }
    auto field = [&](const char* a, const char* b) -> std::string {
      for (const char* k : {a, b})
        if (line.is_object() && line.contains(k) && line[k].is_string()) return line[k];
      throw Error(fmt::format("{}: expected a string \"{}\" (or \"{}\")", where, a, b));
    };
    Gsm8kQuestion q{field("prompt", "question"), field("response", "answer")};
    SHARDLM_CHECK(gsm8k_reference_answer(q.response).has_value(),
                  "{}: the answer has no \"#### N\" final number", where);
    out.push_back(std::move(q));
  }
  SHARDLM_CHECK(!out.empty(), "--data '{}' holds no question", path);
  return out;
}

void eval_gsm8k(InferenceModel& model, const EvalArgs& args) {
  const auto questions = read_gsm8k(args.data, args.windows);
  const int context = generation_context(args.generation, model.config);
  auto tokenizer = make_tokenizer(model.tokenizer_spec);
  ChatTemplateOptions template_options;
  template_options.enable_thinking = parse_enable_thinking(args.enable_thinking);
  template_options.date = args.template_date;
  const ChatFormat format = resolve_chat_format(args.chat_template, *tokenizer, template_options);
  std::ofstream details;
  if (!args.output.empty()) {
    details.open(args.output);
    SHARDLM_CHECK(details.good(), "--output '{}' cannot be written", args.output);
  }
  load_inference_model(model, "evaluate", 1, context);
  ChatSession session(model.loaded->runner(), *tokenizer, format, context,
                      sampling_options(args.generation));
  fmt::print(stderr, "gsm8k: {} questions, {}, template {}, {}\n", questions.size(), model.source,
             format.origin(), describe_sampling(args.generation));
  Gsm8kScore score;
  const bool terminal = isatty(STDERR_FILENO) != 0;
  for (const auto& q : questions) {
    const ChatReply reply = session.reply({{ChatRole::user, q.question, std::nullopt}});
    const bool match = score.add(reply.text, q.response);
    if (details.is_open()) {
      details << nlohmann::json{{"question", q.question},
                                {"reply", reply.text},
                                {"answer", gsm8k_extract_answer(reply.text).value_or("")},
                                {"reference", *gsm8k_reference_answer(q.response)},
                                {"match", match}}
                     .dump()
              << '\n';
    }
    // A progress line rewritten in place for a person watching; nothing in a log file.
    if (terminal)
      fmt::print(stderr, "\rgsm8k: {}/{} answered, {} correct", score.total, questions.size(),
                 score.correct);
  }
  if (terminal) fmt::print(stderr, "\n");
  fmt::print("questions: {}\ncorrect: {}\nwithout a number: {}\naccuracy: {:.4f}\n", score.total,
             score.correct, score.without_answer, score.accuracy());
}
}  // namespace

void register_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand(
      "eval", "Mean cross-entropy of a model on a dataset's validation split, or --task gsm8k: "
              "exact-match accuracy of generated answers");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint directory, run directory or Hugging Face model directory")
      ->required();
  cmd->add_option("--data", args->data,
                  "loss: a directory written by `shardlm prepare` (text) or `prepare --sft` / "
                  "sft (RUN/data); gsm8k: a JSONL of questions and \"#### N\" answers")
      ->required();
  cmd->add_option("--task", args->task, "loss or gsm8k")->capture_default_str();
  cmd->add_option("--split", args->split, "val or train (text datasets)")->capture_default_str();
  cmd->add_option("--seq-len", args->seq_len,
                  "Tokens per row (default: text 256; SFT the dataset's --max-len)");
  cmd->add_option("--windows", args->windows,
                  "Rows (windows, conversations, questions) evaluated from the start (default: "
                  "all of them)");
  cmd->add_option("--micro-batch", args->micro_batch, "Rows per forward pass")
      ->capture_default_str();
  cmd->add_option("--output", args->output, "gsm8k: one JSON line per question (reply, answer, match)");
  add_generation_flags(*cmd, args->generation);
  add_chat_template_flags(*cmd, args->chat_template, args->enable_thinking, args->template_date);
  cmd->add_option("--threads", args->threads, "Compute threads (default: all cores)");
  cmd->callback([args]() {
    SHARDLM_CHECK(args->task == "loss" || args->task == "gsm8k",
                  "--task must be loss or gsm8k, got '{}'", args->task);
    SHARDLM_CHECK(args->split == "val" || args->split == "train",
                  "--split must be val or train, got '{}'", args->split);
    SHARDLM_CHECK(!args->windows || *args->windows >= 1, "--windows must be >= 1, got {}",
                  args->windows.value_or(0));
    SHARDLM_CHECK(args->micro_batch >= 1, "--micro-batch must be >= 1, got {}", args->micro_batch);
    SHARDLM_CHECK(!args->seq_len || *args->seq_len >= 1, "--seq-len must be >= 1, got {}",
                  args->seq_len.value_or(0));
    check_generation_flags(args->generation);
    apply_threads_flag(args->threads);
    InferenceModel model = describe_inference_model(args->checkpoint);
    if (args->task == "gsm8k") {
      eval_gsm8k(model, *args);
      return;
    }
    SHARDLM_CHECK(args->output.empty(), "--output is for --task gsm8k");
    const DatasetMetaJson meta_json(args->data);
    if (meta_json.kind() == "sft") {
      check_tokenizer(model, args->data, meta_json.tokenizer());
      eval_sft(model, *args);
    } else {
      check_tokenizer(model, args->data, read_dataset_meta(args->data).tokenizer);
      eval_text(model, *args);
    }
  });
}

}  // namespace shardlm::cli
