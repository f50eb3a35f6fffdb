#include "shardlm/cli/chat_template_flags.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm::cli {

void add_chat_template_flags(CLI::App& cmd, std::string& chat_template, std::string& enable_thinking,
                             std::string& template_date) {
  cmd.add_option("--template", chat_template,
                 "Chat template: a built-in (chatml, llama3, plain, qwen3) or a FILE.jinja (default: the tokenizer "
                 "directory's own chat_template, else chatml/llama3/plain by its special tokens)");
  cmd.add_option("--enable-thinking", enable_thinking,
                 "true|false: passed to the template as enable_thinking (Qwen3: false puts an empty think block in "
                 "the prompt); default: not passed, as apply_chat_template without it");
  cmd.add_option("--template-date", template_date,
                 "YYYY-MM-DD the template's strftime_now() formats (Llama 3.2's \"Today Date\"); default: today (UTC)");
}

std::optional<bool> parse_enable_thinking(const std::string& value) {
  if (value.empty()) return std::nullopt;
  if (value == "true") return true;
  if (value == "false") return false;
  throw Error("--enable-thinking '" + value + "' (expected true or false)");
}

}  // namespace shardlm::cli
