// `shardlm chat`: talk to a checkpoint or a Hugging Face model directory, one user turn
// per stdin line, replies streamed; or --input FILE.jsonl: one reply per conversation,
// written as JSONL (docs/generation.md has the schema).
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "shardlm/cli/chat_flags.hpp"
#include "shardlm/cli/chat_template_flags.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/inference_model.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/train/chat_session.hpp"

namespace shardlm::cli {

namespace {

struct ChatArgs {
  std::string checkpoint;
  std::string input, output;
  std::string system;
  GenerationFlags generation;
  std::string chat_template, enable_thinking, template_date;
  std::optional<int> threads;
};

// The messages of one --input line: {"messages": [{"role", "content"}, ...]}, roles
// system, user, assistant; the reply is the next assistant turn.
std::vector<ChatMessage> input_messages(const nlohmann::json& line, const std::string& where) {
  SHARDLM_CHECK(line.is_object() && line.contains("messages") && line["messages"].is_array() &&
                    !line["messages"].empty(),
                "{}: expected {{\"messages\": [{{\"role\": ..., \"content\": ...}}, ...]}}", where);
  std::vector<ChatMessage> messages;
  for (const auto& m : line["messages"]) {
    SHARDLM_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                      m.contains("content") && m["content"].is_string(),
                  "{}: message {} needs a string \"role\" and a string \"content\"", where,
                  messages.size() + 1);
    const std::string role = m["role"];
    ChatRole r;
    if (role == "system") r = ChatRole::system;
    else if (role == "user") r = ChatRole::user;
    else if (role == "assistant") r = ChatRole::assistant;
    else throw Error(fmt::format("{}: message {} has role '{}' (expected system, user or assistant)",
                                 where, messages.size() + 1, role));
    messages.push_back({r, m["content"].get<std::string>(), std::nullopt});
  }
  return messages;
}

void run_batch(ChatSession& session, const ChatArgs& args) {
  // Every line is read and checked before anything is generated or written.
  std::ifstream in(args.input);
  SHARDLM_CHECK(in.good(), "--input '{}' cannot be read", args.input);
  std::vector<std::pair<nlohmann::json, std::vector<ChatMessage>>> lines;
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", args.input, n);
    nlohmann::json line;
    try {
      line = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: not JSON ({})", where, e.what()));
    }
    auto messages = input_messages(line, where);
    lines.emplace_back(std::move(line), std::move(messages));
  }
  SHARDLM_CHECK(!lines.empty(), "--input '{}' holds no conversation", args.input);
  const std::string tmp = args.output.empty() ? "" : args.output + ".tmp." + std::to_string(getpid());
  std::ofstream file;
  if (!tmp.empty()) {
    file.open(tmp);
    SHARDLM_CHECK(file.good(), "--output '{}' cannot be written", args.output);
  }
  std::ostream& out = tmp.empty() ? std::cout : file;
  for (auto& [line, messages] : lines) {
    const ChatReply reply = session.reply(messages);
    line["messages"].push_back({{"role", "assistant"}, {"content", reply.text}});
    line["response"] = reply.text;
    out << line.dump() << '\n';
    out.flush();
  }
  if (!tmp.empty()) {
    file.close();
    SHARDLM_CHECK(file.good(), "--output '{}': writing failed", args.output);
    std::filesystem::rename(tmp, args.output);
    fmt::print(stderr, "chat: {} replies written to {}\n", lines.size(), args.output);
  }
}

void run_interactive(ChatSession& session, const ChatArgs& args) {
  std::vector<ChatMessage> messages;
  if (!args.system.empty()) messages.push_back({ChatRole::system, args.system, std::nullopt});
  const bool terminal = isatty(STDIN_FILENO) != 0;
  if (terminal) fmt::print(stderr, "(one line per turn; /reset starts over; Ctrl-D ends)\n");
  std::string line;
  while (true) {
    if (terminal) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/reset") {
      messages.resize(args.system.empty() ? 0 : 1);
      continue;
    }
    messages.push_back({ChatRole::user, line, std::nullopt});
    const ChatReply reply = session.reply(messages, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!reply.stopped)
      fmt::print(stderr, "(reply cut at {} tokens: --max-new-tokens)\n", reply.ids.size());
    messages.push_back({ChatRole::assistant, reply.text, std::nullopt});
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  auto* cmd = app.add_subcommand(
      "chat", "Talk to a checkpoint or Hugging Face model with its chat template (stdin lines "
              "are user turns), or reply to every conversation of --input FILE.jsonl");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint directory, run directory or Hugging Face model directory")
      ->required();
  cmd->add_option("--input", args->input,
                  "JSONL of {\"messages\": [...]}: write each with the reply appended (batch mode)");
  cmd->add_option("--output", args->output, "Where --input's replies go (default: stdout)");
  cmd->add_option("--system", args->system, "System message that starts the conversation");
  add_generation_flags(*cmd, args->generation);
  add_chat_template_flags(*cmd, args->chat_template, args->enable_thinking, args->template_date);
  cmd->add_option("--threads", args->threads, "Compute threads (default: all cores)");
  cmd->callback([args]() {
    check_generation_flags(args->generation);
    SHARDLM_CHECK(args->output.empty() || !args->input.empty(),
                  "--output needs --input (interactive replies go to the terminal)");
    apply_threads_flag(args->threads);
    InferenceModel model = describe_inference_model(args->checkpoint);
    const int context = generation_context(args->generation, model.config);
    auto tokenizer = make_tokenizer(model.tokenizer_spec);
    ChatTemplateOptions template_options;
    template_options.enable_thinking = parse_enable_thinking(args->enable_thinking);
    template_options.date = args->template_date;
    const ChatFormat format = resolve_chat_format(args->chat_template, *tokenizer, template_options);
    load_inference_model(model, "chat with", 1, context);
    ChatSession session(model.loaded->runner(), *tokenizer, format, context,
                        sampling_options(args->generation));
    fmt::print(stderr, "chat: {} ({}), template {}, context {} tokens, {}\n", model.source,
               model.config.family, format.origin(), context,
               describe_sampling(args->generation));
    if (args->input.empty())
      run_interactive(session, *args);
    else
      run_batch(session, *args);
  });
}

}  // namespace shardlm::cli
