#include "shardlm/data/chat_template.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/data/utf8.hpp"

namespace shardlm {
namespace {

constexpr std::string_view kQwenDefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

bool is_python_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// The text of a conversation being rendered and the byte spans that are targets.
struct Rendering {
  std::string text;
  std::vector<std::pair<size_t, size_t>> targets;

  void add(std::string_view piece) { text += piece; }
  void add_target(std::string_view content, std::string_view end_of_turn) {
    const size_t begin = text.size();
    text += content;
    text += end_of_turn;
    targets.emplace_back(begin, text.size());
  }
};

int32_t required_token(const Tokenizer& tokenizer, ChatTemplate chat_template, std::string_view text) {
  const std::optional<int32_t> id = tokenizer.special_token_id(text);
  SHARDLM_CHECK(id.has_value(), "chat template {} needs the special token {}, which tokenizer {} does not have",
                chat_template_name(chat_template), text, tokenizer.spec());
  return *id;
}

Rendering render_chatml(const Tokenizer& tokenizer, const Conversation& conversation) {
  for (const char* token : {"<|im_start|>", "<|im_end|>"}) required_token(tokenizer, ChatTemplate::chatml, token);
  Rendering out;
  const auto& messages = conversation.messages;
  const bool has_system = !messages.empty() && messages[0].role == ChatRole::system;
  out.add("<|im_start|>system\n");
  out.add(has_system ? tokenizer.normalize(messages[0].content) : std::string(kQwenDefaultSystem));
  out.add("<|im_end|>\n");
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    out.add("<|im_start|>");
    out.add(chat_role_name(messages[i].role));
    out.add("\n");
    const std::string content = tokenizer.normalize(messages[i].content);
    if (messages[i].role == ChatRole::assistant) {
      out.add_target(content, "<|im_end|>");
    } else {
      out.add(content);
      out.add("<|im_end|>");
    }
    out.add("\n");
  }
  return out;
}

Rendering render_llama3(const Tokenizer& tokenizer, const Conversation& conversation) {
  for (const char* token : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
    required_token(tokenizer, ChatTemplate::llama3, token);
  Rendering out;
  out.add("<|begin_of_text|>");
  for (const ChatMessage& message : conversation.messages) {
    out.add("<|start_header_id|>");
    out.add(chat_role_name(message.role));
    out.add("<|end_header_id|>\n\n");
    const std::string content = tokenizer.normalize(python_strip(message.content));
    if (message.role == ChatRole::assistant) {
      out.add_target(content, "<|eot_id|>");
    } else {
      out.add(content);
      out.add("<|eot_id|>");
    }
  }
  return out;
}

Rendering render_plain(const Tokenizer& tokenizer, const Conversation& conversation) {
  const std::optional<int32_t> end_of_text = tokenizer.end_of_text();
  SHARDLM_CHECK(end_of_text.has_value(), "chat template plain ends assistant turns with the end-of-text token, "
                "which tokenizer {} does not have", tokenizer.spec());
  const int32_t eos_id[1] = {*end_of_text};
  const std::string eos = tokenizer.decode(eos_id);
  Rendering out;
  for (const ChatMessage& message : conversation.messages) {
    const std::string content = tokenizer.normalize(message.content);
    switch (message.role) {
      case ChatRole::system:
        out.add(content);
        break;
      case ChatRole::user:
        out.add("User: ");
        out.add(content);
        break;
      case ChatRole::assistant:
        out.add("Assistant: ");
        out.add_target(content, eos);
        break;
    }
    out.add("\n\n");
  }
  return out;
}

}  // namespace

std::string_view chat_template_name(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::chatml: return "chatml";
    case ChatTemplate::llama3: return "llama3";
    case ChatTemplate::plain: return "plain";
  }
  return "?";
}

ChatTemplate parse_chat_template(std::string_view name) {
  for (ChatTemplate t : {ChatTemplate::chatml, ChatTemplate::llama3, ChatTemplate::plain})
    if (name == chat_template_name(t)) return t;
  throw Error(fmt::format("unknown chat template '{}' (expected chatml, llama3 or plain)", name));
}

ChatTemplate default_chat_template(const Tokenizer& tokenizer) {
  auto has = [&](std::string_view text) { return tokenizer.special_token_id(text).has_value(); };
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatTemplate::chatml;
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>") && has("<|begin_of_text|>"))
    return ChatTemplate::llama3;
  return ChatTemplate::plain;
}

std::string_view python_strip(std::string_view text) {
  size_t begin = text.size(), end = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t at = pos;
    const std::optional<char32_t> cp = utf8::decode(text, pos);
    if (!cp) ++pos;
    if (!cp || !is_python_space(*cp)) {
      begin = std::min(begin, at);
      end = pos;
    }
  }
  return begin >= end ? std::string_view() : text.substr(begin, end - begin);
}

TokenizedChat tokenize_chat(const Tokenizer& tokenizer, ChatTemplate chat_template, const Conversation& conversation) {
  Rendering rendering;
  switch (chat_template) {
    case ChatTemplate::chatml: rendering = render_chatml(tokenizer, conversation); break;
    case ChatTemplate::llama3: rendering = render_llama3(tokenizer, conversation); break;
    case ChatTemplate::plain: rendering = render_plain(tokenizer, conversation); break;
  }
  TokenizedChat out;
  out.ids = tokenizer.encode(rendering.text, SpecialTokens::recognized);
  out.targets.assign(out.ids.size(), 0);
  // Walk the tokens' bytes through the text: a token is a target when it starts
  // inside a target span.
  size_t offset = 0;
  size_t span = 0;
  for (size_t i = 0; i < out.ids.size(); ++i) {
    while (span < rendering.targets.size() && offset >= rendering.targets[span].second) ++span;
    if (span < rendering.targets.size() && offset >= rendering.targets[span].first) out.targets[i] = 1;
    offset += tokenizer.decode(std::span<const int32_t>(&out.ids[i], 1)).size();
  }
  // The contents were normalized one by one; the whole text must come back unchanged
  // for the byte offsets above to be the tokens' places.
  SHARDLM_ASSERT(offset == rendering.text.size() && tokenizer.decode(out.ids) == rendering.text);
  out.text = std::move(rendering.text);
  return out;
}

}  // namespace shardlm
