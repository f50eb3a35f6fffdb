// Chat templates: a conversation rendered into the token ids a model is trained
// on, and which of them are loss targets. A template is Jinja source rendered
// by shardlm's interpreter (data/jinja/) exactly as transformers'
// apply_chat_template renders it (trim_blocks, lstrip_blocks, the tokenizer's
// special tokens as variables, tools=None, strftime_now):
//   - the model or tokenizer directory's own template (tokenizer_config.json's
//     "chat_template", a string or the list entry named "default", or
//     chat_template.jinja beside it, which wins as in transformers), or
//   - --template FILE.jinja, or
//   - a built-in (builtin_chat_templates.hpp): chatml (Qwen2.5), llama3
//     (Meta-Llama-3), plain (base models), qwen3 (Qwen3); a directory without a
//     template gets chatml, llama3 or plain from its special tokens.
// The training text is the whole conversation rendered without a generation
// prompt, tokenized as one string with special tokens recognized (as
// apply_chat_template(tokenize=True) does).
//
// Targets, found by rendering (docs/sft.md): for assistant message i,
//   P = render(messages[:i], add_generation_prompt=True), L = render(messages[:i+1]);
//   the turn's text is T = L[len(P):], cut after its last special token (the
//   end-of-turn token the model emits to stop; Qwen's "\n" after <|im_end|> is
//   never generated). In the training text the turn starts where it departs
//   from P and is the longest tail of T found there: all of T when the
//   template is prefix-stable, the answer without its think block for Qwen3's
//   earlier turns (the template drops their reasoning). A token is a target
//   when it starts inside a turn's span. Error naming the turn when the
//   template renders the conversation before a turn differently once the turn
//   follows, or the turn cannot be found.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardlm/data/chat_dataset.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

namespace jinja {
class Template;
}

enum class ChatTemplate { chatml, llama3, plain, qwen3 };

std::string_view chat_template_name(ChatTemplate chat_template);
// Error for an unknown name: "unknown chat template 'x' (expected chatml, llama3,
// plain, qwen3 or a .jinja file)".
ChatTemplate parse_chat_template(std::string_view name);
// The built-in a tokenizer's model uses: chatml when it has <|im_start|> and
// <|im_end|>, llama3 when it has <|start_header_id|>, <|end_header_id|>,
// <|eot_id|> and <|begin_of_text|>, else plain (which needs an end-of-text token).
ChatTemplate default_chat_template(const Tokenizer& tokenizer);

struct ChatTemplateOptions {
  std::optional<bool> enable_thinking;  // passed to the template as enable_thinking when set
  // The day strftime_now() formats ("Today Date" in Llama 3.2's template):
  // YYYY-MM-DD; empty: today (UTC).
  std::string date;
};

// A template ready to render: its source, where it came from, the tokenizer's
// special-token variables (bos_token, eos_token, ...) and the options.
class ChatFormat {
 public:
  // Error "chat template <origin> line N: ..." when the source does not parse.
  ChatFormat(std::string id, std::string origin, std::string source, std::vector<std::pair<std::string, std::string>> special_tokens,
             ChatTemplateOptions options);
  ChatFormat(ChatFormat&&) noexcept;
  ~ChatFormat();

  // What a dataset's meta.json records: the built-in's name, or "sha256:HEX" of
  // the Jinja source; ",enable_thinking=true|false" appended when set.
  const std::string& id() const { return id_; }
  const std::string& origin() const { return origin_; }  // for messages: "qwen3", "DIR/tokenizer_config.json", ...
  const std::string& source() const { return source_; }
  // The first `count` messages rendered (error "chat template ORIGIN line N: ...").
  std::string render(const std::vector<ChatMessage>& messages, size_t count, bool add_generation_prompt) const;

 private:
  std::string id_, origin_, source_;
  std::unique_ptr<jinja::Template> template_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
  ChatTemplateOptions options_;
  int64_t now_ = 0;  // strftime_now's time, seconds since the epoch
};

// A built-in template with the tokenizer's special tokens (tokenizer_config.json's
// when `tokenizer_dir` has one, else the tokenizer's own). Error naming the
// template and the token when the tokenizer lacks one the template needs.
ChatFormat builtin_chat_format(ChatTemplate chat_template, const Tokenizer& tokenizer,
                               const std::string& tokenizer_dir, const ChatTemplateOptions& options);

// The template `choice` names for `tokenizer`: empty: its directory's own (hf
// tokenizers), else the default built-in; a built-in's name; or a path ending
// in .jinja. Error for an unknown name, an unreadable
// file, or a tokenizer_config.json whose chat_template is malformed.
ChatFormat resolve_chat_format(const std::string& choice, const Tokenizer& tokenizer,
                               const ChatTemplateOptions& options);

struct TokenizedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> targets;  // per id: 1 = loss target, 0 = not
  std::string text;              // the rendered conversation (contents normalized)
};

// Renders and tokenizes `conversation`, targets by the rule at the top. Error
// (naming the template) for a failed render, data the template cannot express
// (reasoning_content for a template that never reads it), or a turn whose span
// cannot be found.
TokenizedChat tokenize_chat(const Tokenizer& tokenizer, const ChatFormat& format, const Conversation& conversation);
// With a built-in and default options.
TokenizedChat tokenize_chat(const Tokenizer& tokenizer, ChatTemplate chat_template, const Conversation& conversation);

// Python's str.strip(): removes leading and trailing Unicode white space (what
// Jinja's trim filter does).
std::string_view python_strip(std::string_view text);

}  // namespace shardlm
