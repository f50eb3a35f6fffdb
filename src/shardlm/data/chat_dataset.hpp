// Chat / instruction datasets (JSONL, one example per line) read into
// conversations. Each line is one of:
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//   {"query" or "prompt": "...", "response": "...", "system": "..."?, "history": [["q", "r"], ...]?}
//   {"instruction": "...", "input": "..."?, "output": "...", "system": "..."?}   (alpaca)
// tried in that order (a line with "messages" is a messages line whatever else it
// holds). Alpaca's user turn is the instruction, then "\n" and the input when both
// are non-empty (ms-swift's convention). Other keys are ignored (GSM8K and
// self-instruct lines carry extra fields). A message holds "role" and "content",
// and an assistant message may hold "reasoning_content" (a string or null: the
// thinking Qwen3's template renders into its <think> block); other keys are
// refused, since they would change the rendering (tool_calls, ...).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

enum class ChatRole { system, user, assistant };
std::string_view chat_role_name(ChatRole role);

struct ChatMessage {
  ChatRole role;
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant turns only
};

struct Conversation {
  std::vector<ChatMessage> messages;
  int line = 0;  // 1-based line of the dataset file it came from (0: not from a file)
};

// One line's conversation. Error "FILE line N: ..." (`where` is "FILE line N") for
// an unknown role, a content that is not a string, a conversation without an
// assistant turn, or a line of none of the forms above.
Conversation conversation_from_json(const nlohmann::json& line, const std::string& where);

// Every non-blank line of a JSONL file. Error naming the file (and the line) for a
// missing or unreadable file, malformed JSON, a line conversation_from_json
// refuses, or a file without any example.
std::vector<Conversation> read_chat_dataset(const std::string& path);

}  // namespace shardlm
