// The Jinja sources of shardlm's built-in chat templates (--template NAME):
//   chatml  Qwen2.5-Instruct's template
//   llama3  Meta-Llama-3-Instruct's template
//   plain   shardlm's template for base models (User:/Assistant: lines, eos after answers)
//   qwen3   Qwen3's template (thinking block, reasoning_content, enable_thinking)
#pragma once

#include <string_view>

namespace shardlm {

extern const std::string_view kBuiltinChatTemplate_chatml;
extern const std::string_view kBuiltinChatTemplate_llama3;
extern const std::string_view kBuiltinChatTemplate_plain;
extern const std::string_view kBuiltinChatTemplate_qwen3;

}  // namespace shardlm
