// A conversation with a model (`shardlm chat`, `sample --chat`): the messages rendered
// with the model's chat template and a generation prompt, run through the model with a
// KV cache (only the part of the conversation that is new since the last reply runs),
// and the assistant's reply sampled until the template's end-of-turn token or the
// end-of-text token, its text streamed as it comes (docs/generation.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardlm/data/chat_template.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/train/sampling.hpp"

namespace shardlm {

// The ids that end an assistant turn: the first special token the template puts after
// an assistant message's content (<|im_end|>, <|eot_id|>, ...), and the tokenizer's
// end-of-text token. Error when there is none (generation could never stop on its own).
std::vector<int32_t> chat_stop_ids(const Tokenizer& tokenizer, const ChatFormat& format);

struct ChatReply {
  std::string text;            // without the stop token
  std::vector<int32_t> ids;    // as generated, with the stop token when one came
  bool stopped = false;        // an end-of-turn / end-of-text token came
  int prompt_tokens = 0;
};

class ChatSession {
 public:
  // sampling.num_tokens caps each reply; its stop_ids are replaced by chat_stop_ids.
  ChatSession(ModelRunner& runner, const Tokenizer& tokenizer, const ChatFormat& format,
              int context, SamplingOptions sampling);
  // The next assistant turn of `messages`; on_text gets the reply's text piece by piece.
  // Error when the rendered conversation does not fit the context.
  ChatReply reply(const std::vector<ChatMessage>& messages,
                  const std::function<void(std::string_view)>& on_text = {});
  const std::vector<int32_t>& stop_ids() const { return sampling_.stop_ids; }

 private:
  const Tokenizer& tokenizer_;
  const ChatFormat& format_;
  SamplingOptions sampling_;
  Generator generator_;
  Rng rng_;
};

}  // namespace shardlm
