// Chat templates: a conversation rendered into the token ids a model is trained
// on, and which of them are loss targets. The ids equal transformers'
// apply_chat_template(messages, tokenize=True) with the model's real template
// (the full conversation, no generation prompt):
//   chatml  Qwen2.5: "<|im_start|>{role}\n{content}<|im_end|>\n" per message; when
//           the first message is not a system one, Qwen2.5's default system turn
//           "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." first
//   llama3  Llama 3: "<|begin_of_text|>" then per message
//           "<|start_header_id|>{role}<|end_header_id|>\n\n{content stripped}<|eot_id|>"
//           (stripped of surrounding white space as Jinja's trim does)
//   plain   GPT-2 and other base models: system "{content}\n\n", user
//           "User: {content}\n\n", assistant "Assistant: {content}{eos}\n\n" with eos
//           the tokenizer's end-of-text token text ("<|endoftext|>")
// Targets: each assistant turn's content and its end-of-turn token (<|im_end|>,
// <|eot_id|>, eos); the "\n" after <|im_end|> and everything else is not a target
// (ms-swift's convention). The rendered text is tokenized as one string with
// special tokens recognized, as apply_chat_template does (so special-token text
// inside a message is the special token there too); a token is a target when it
// starts inside a target span of the text; one that starts before an assistant's
// content and runs into it (a merge across the header) is not.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardlm/data/chat_dataset.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

enum class ChatTemplate { chatml, llama3, plain };

std::string_view chat_template_name(ChatTemplate chat_template);
// Error for an unknown name: "unknown chat template 'x' (expected chatml, llama3 or plain)".
ChatTemplate parse_chat_template(std::string_view name);
// The template a tokenizer's model uses: chatml when it has <|im_start|> and
// <|im_end|>, llama3 when it has <|start_header_id|>, <|end_header_id|>,
// <|eot_id|> and <|begin_of_text|>, else plain (which needs an end-of-text token).
ChatTemplate default_chat_template(const Tokenizer& tokenizer);

struct TokenizedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> targets;  // per id: 1 = loss target, 0 = not
  std::string text;              // the rendered conversation (contents normalized)
};

// Renders and tokenizes `conversation`. Error (naming the template and the token)
// when the tokenizer lacks a token the template needs.
TokenizedChat tokenize_chat(const Tokenizer& tokenizer, ChatTemplate chat_template, const Conversation& conversation);

// Python's str.strip(): removes leading and trailing Unicode white space (what
// Jinja's trim filter does).
std::string_view python_strip(std::string_view text);

}  // namespace shardlm
