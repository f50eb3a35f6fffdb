#include "shardlm/train/chat_session.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"

namespace shardlm {

std::vector<int32_t> chat_stop_ids(const Tokenizer& tokenizer, const ChatFormat& format) {
  std::vector<int32_t> ids;
  // What follows an assistant message's content in the template: its end of turn.
  const std::string marker = "shardlm-reply-marker";
  const std::vector<ChatMessage> messages = {{ChatRole::user, "hi", std::nullopt},
                                             {ChatRole::assistant, marker, std::nullopt}};
  const std::string rendered = format.render(messages, messages.size(), false);
  const size_t at = rendered.rfind(marker);
  if (at != std::string::npos) {
    const std::string after = rendered.substr(at + marker.size());
    for (int32_t id : tokenizer.encode(after, SpecialTokens::recognized)) {
      const std::string text = tokenizer.decode(std::span<const int32_t>(&id, 1));
      if (tokenizer.special_token_id(text) == id) {
        ids.push_back(id);
        break;
      }
    }
  }
  if (const auto eot = tokenizer.end_of_text(); eot && std::find(ids.begin(), ids.end(), *eot) == ids.end())
    ids.push_back(*eot);
  SHARDLM_CHECK(!ids.empty(), "chat template {} puts no special token after an assistant turn "
                "and the tokenizer has no end-of-text token: a reply could never end",
                format.origin());
  return ids;
}

ChatSession::ChatSession(ModelRunner& runner, const Tokenizer& tokenizer, const ChatFormat& format,
                         int context, SamplingOptions sampling)
    : tokenizer_(tokenizer),
      format_(format),
      sampling_(std::move(sampling)),
      generator_(runner, context),
      rng_(sampling_.seed) {
  sampling_.stop_ids = chat_stop_ids(tokenizer, format);
}

ChatReply ChatSession::reply(const std::vector<ChatMessage>& messages,
                             const std::function<void(std::string_view)>& on_text) {
  const std::string prompt = format_.render(messages, messages.size(), true);
  std::vector<int32_t> ids = tokenizer_.encode(prompt, SpecialTokens::recognized);
  const auto frame = tokenizer_.frame();
  // A template that writes the BOS itself (Llama 3) is not framed again.
  if (!frame.prefix.empty() && !std::equal(frame.prefix.begin(), frame.prefix.end(), ids.begin(),
                                           ids.begin() + std::min(ids.size(), frame.prefix.size())))
    ids.insert(ids.begin(), frame.prefix.begin(), frame.prefix.end());
  SHARDLM_CHECK(!ids.empty(), "chat template {} rendered an empty prompt", format_.origin());
  SHARDLM_CHECK(static_cast<int>(ids.size()) < generator_.capacity(),
                "the conversation is {} tokens, the context holds {} (start a new one, or give "
                "a larger --max-context)",
                ids.size(), generator_.capacity());
  ChatReply out;
  out.prompt_tokens = static_cast<int>(ids.size());
  std::vector<float> logits = generator_.feed_sequence(ids);
  size_t printed = 0;
  for (int i = 0; i < sampling_.num_tokens; ++i) {
    const int32_t next = sample_from_logits(logits, sampling_.temperature, sampling_.top_k, rng_,
                                            sampling_.top_p);
    out.ids.push_back(next);
    if (std::find(sampling_.stop_ids.begin(), sampling_.stop_ids.end(), next) !=
        sampling_.stop_ids.end()) {
      out.stopped = true;
      break;
    }
    // Byte-level tokens decode to raw bytes: the text so far is a prefix of the next.
    out.text = tokenizer_.decode(std::span<const int32_t>(out.ids));
    if (on_text && out.text.size() > printed) {
      on_text(std::string_view(out.text).substr(printed));
      printed = out.text.size();
    }
    if (generator_.room() == 0 || i + 1 == sampling_.num_tokens) break;
    logits = generator_.feed(std::span<const int32_t>(&next, 1));
  }
  return out;
}

}  // namespace shardlm
