#include "shardlm/data/chat_dataset.hpp"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/data/text_lines.hpp"

namespace shardlm {
namespace {

using nlohmann::json;

// A key that is present and not null ("system": null means no system prompt).
bool has(const json& object, const char* key) { return object.contains(key) && !object.at(key).is_null(); }

std::string short_dump(const json& value) {
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

const std::string& string_field(const json& object, const char* key, const std::string& where) {
  const json& value = object.at(key);
  SHARDLM_CHECK(value.is_string(), "{}: \"{}\" is {} (expected a string)", where, key, short_dump(value));
  return value.get_ref<const std::string&>();
}

ChatRole parse_role(const json& role, const std::string& where) {
  if (role == "system") return ChatRole::system;
  if (role == "user") return ChatRole::user;
  if (role == "assistant") return ChatRole::assistant;
  throw Error(fmt::format("{}: unknown role {} (expected \"system\", \"user\" or \"assistant\")", where,
                          short_dump(role)));
}

void read_messages(const json& messages, const std::string& where, Conversation& out) {
  SHARDLM_CHECK(messages.is_array(), "{}: \"messages\" is {} (expected an array of {{\"role\", \"content\"}})",
                where, short_dump(messages));
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& message = messages[i];
    const std::string at = fmt::format("{} message {}", where, i);
    SHARDLM_CHECK(message.is_object() && message.contains("role") && message.contains("content"),
                  "{}: {} (expected {{\"role\": ..., \"content\": ...}})", at, short_dump(message));
    for (const auto& [key, value] : message.items())
      SHARDLM_CHECK(key == "role" || key == "content" || key == "reasoning_content",
                    "{}: key \"{}\" is not supported (expected \"role\", \"content\" and, for assistant turns, "
                    "\"reasoning_content\")", at, key);
    ChatMessage parsed{parse_role(message["role"], at), string_field(message, "content", at), std::nullopt};
    if (has(message, "reasoning_content")) {
      SHARDLM_CHECK(parsed.role == ChatRole::assistant, "{}: \"reasoning_content\" on a {} message (expected it on "
                    "assistant turns only)", at, chat_role_name(parsed.role));
      parsed.reasoning_content = string_field(message, "reasoning_content", at);
    }
    out.messages.push_back(std::move(parsed));
  }
}

void read_query_response(const json& line, const char* query_key, const std::string& where, Conversation& out) {
  if (has(line, "system")) out.messages.push_back({ChatRole::system, string_field(line, "system", where), std::nullopt});
  if (has(line, "history")) {
    const json& history = line["history"];
    SHARDLM_CHECK(history.is_array(), "{}: \"history\" is {} (expected [[query, response], ...])", where,
                  short_dump(history));
    for (const json& turn : history) {
      SHARDLM_CHECK(turn.is_array() && turn.size() == 2 && turn[0].is_string() && turn[1].is_string(),
                    "{}: history entry {} (expected [query, response], two strings)", where, short_dump(turn));
      out.messages.push_back({ChatRole::user, turn[0].get<std::string>(), std::nullopt});
      out.messages.push_back({ChatRole::assistant, turn[1].get<std::string>(), std::nullopt});
    }
  }
  out.messages.push_back({ChatRole::user, string_field(line, query_key, where), std::nullopt});
  out.messages.push_back({ChatRole::assistant, string_field(line, "response", where), std::nullopt});
}

void read_alpaca(const json& line, const std::string& where, Conversation& out) {
  if (has(line, "system")) out.messages.push_back({ChatRole::system, string_field(line, "system", where), std::nullopt});
  const std::string& instruction = string_field(line, "instruction", where);
  const std::string input = has(line, "input") ? string_field(line, "input", where) : std::string();
  std::string query = instruction.empty() ? input : input.empty() ? instruction : instruction + "\n" + input;
  out.messages.push_back({ChatRole::user, std::move(query), std::nullopt});
  out.messages.push_back({ChatRole::assistant, string_field(line, "output", where), std::nullopt});
}

}  // namespace

std::string_view chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::system: return "system";
    case ChatRole::user: return "user";
    case ChatRole::assistant: return "assistant";
  }
  return "?";
}

Conversation conversation_from_json(const json& line, const std::string& where) {
  SHARDLM_CHECK(line.is_object(), "{}: {} (expected a JSON object)", where, short_dump(line));
  Conversation out;
  if (line.contains("messages")) {
    read_messages(line["messages"], where, out);
  } else if (line.contains("response") && (line.contains("query") || line.contains("prompt"))) {
    read_query_response(line, line.contains("query") ? "query" : "prompt", where, out);
  } else if (line.contains("instruction") && line.contains("output")) {
    read_alpaca(line, where, out);
  } else {
    throw Error(fmt::format("{}: {} is no chat example (expected \"messages\", \"query\"/\"prompt\" + \"response\", "
                            "or \"instruction\" + \"output\")", where, short_dump(line)));
  }
  bool has_assistant = false;
  for (const ChatMessage& message : out.messages) has_assistant = has_assistant || message.role == ChatRole::assistant;
  SHARDLM_CHECK(has_assistant, "{}: the conversation has no assistant turn (expected at least one, the loss is "
                "taken on assistant turns only)", where);
  return out;
}

std::vector<Conversation> read_chat_dataset(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    // Name what it holds that could be meant (a directory of JSONL files, or a run's data).
    std::vector<std::string> jsonl;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.is_regular_file() && entry.path().extension() == ".jsonl")
        jsonl.push_back(entry.path().filename().string());
    std::sort(jsonl.begin(), jsonl.end());
    if (jsonl.size() > 3) jsonl.resize(3), jsonl.push_back("...");
    throw Error(fmt::format("dataset '{}' is a directory (expected a JSONL file of conversations{})", path,
                            jsonl.empty() ? "; --dataset takes files, one flag each"
                                          : fmt::format("; it holds {}: name each with --dataset",
                                                        fmt::join(jsonl, ", "))));
  }
  SHARDLM_CHECK(fs::is_regular_file(path), "dataset file {} does not exist (expected a JSONL file)", path);
  const std::string text = read_text_file(path, "a JSONL dataset file");
  std::vector<Conversation> conversations;
  for_each_line(text, [&](int line_number, std::string_view line) {
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;
    const std::string where = fmt::format("{} line {}", path, line_number);
    json parsed;
    try {
      parsed = json::parse(line);
    } catch (const json::parse_error& e) {
      throw Error(fmt::format("{}: malformed JSON at byte {} (expected one JSON object per line)", where, e.byte));
    }
    conversations.push_back(conversation_from_json(parsed, where));
    conversations.back().line = line_number;
  });
  SHARDLM_CHECK(!conversations.empty(), "dataset file {} has no examples (expected one JSON object per line)", path);
  return conversations;
}

}  // namespace shardlm
