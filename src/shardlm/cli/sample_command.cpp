#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "shardlm/cli/chat_flags.hpp"
#include "shardlm/cli/chat_template_flags.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/inference_model.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/train/chat_session.hpp"
#include "shardlm/train/sampling.hpp"

namespace shardlm::cli {

namespace {
struct SampleArgs {
  std::string checkpoint;
  std::string prompt = "\n";
  bool chat = false;
  GenerationFlags generation{.max_new_tokens = 100, .temperature = 0.8f, .top_k = 40};
  std::string chat_template, enable_thinking, template_date;
  std::optional<int> threads;
};

void print_piece(std::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}
}  // namespace

void register_sample(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint or Hugging Face model");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint directory, run directory or Hugging Face model directory")
      ->required();
  cmd->add_option("--prompt", args->prompt, "Text to continue (with --chat: the user's message)");
  cmd->add_flag("--chat", args->chat,
                "Render --prompt as a user turn with the chat template and print the reply, "
                "ending at the end-of-turn token");
  add_generation_flags(*cmd, args->generation, "--tokens");
  add_chat_template_flags(*cmd, args->chat_template, args->enable_thinking, args->template_date);
  cmd->add_option("--threads", args->threads, "Compute threads (default: all cores)");
  cmd->callback([args]() {
    check_generation_flags(args->generation);
    apply_threads_flag(args->threads);
    InferenceModel model = describe_inference_model(args->checkpoint);
    const int context = generation_context(args->generation, model.config);
    auto tokenizer = make_tokenizer(model.tokenizer_spec);
    if (args->chat) {
      ChatTemplateOptions template_options;
      template_options.enable_thinking = parse_enable_thinking(args->enable_thinking);
      template_options.date = args->template_date;
      const ChatFormat format =
          resolve_chat_format(args->chat_template, *tokenizer, template_options);
      load_inference_model(model, "sample from", 1, context);
      ChatSession session(model.loaded->runner(), *tokenizer, format, context,
                          sampling_options(args->generation));
      session.reply({{ChatRole::user, args->prompt, std::nullopt}}, print_piece);
      std::printf("\n");
      return;
    }
    SHARDLM_CHECK(args->chat_template.empty() && args->enable_thinking.empty() &&
                      args->template_date.empty(),
                  "--template, --enable-thinking and --template-date need --chat");
    load_inference_model(model, "sample from", 1, context);
    std::vector<int32_t> prompt = tokenizer->encode(args->prompt);
    if (prompt.empty()) prompt.push_back(tokenizer->end_of_text().value_or(0));
    print_piece(args->prompt);
    // Byte-level tokens decode to raw bytes: the text so far is a prefix of the next.
    std::vector<int32_t> ids;
    size_t printed = 0;
    generate(model.loaded->runner(), prompt, context, sampling_options(args->generation),
             [&](int32_t id) {
               ids.push_back(id);
               const std::string text = tokenizer->decode(ids);
               print_piece(std::string_view(text).substr(printed));
               printed = text.size();
             });
    std::printf("\n");
  });
}

}  // namespace shardlm::cli
