#include "shardlm/data/chat_template.hpp"

#include <ctime>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/builtin_chat_templates.hpp"
#include "shardlm/data/jinja/builtins.hpp"
#include "shardlm/data/jinja/template.hpp"
#include "shardlm/data/utf8.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

constexpr ChatTemplate kBuiltins[] = {ChatTemplate::chatml, ChatTemplate::llama3, ChatTemplate::plain,
                                      ChatTemplate::qwen3};

std::string_view builtin_source(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::chatml: return kBuiltinChatTemplate_chatml;
    case ChatTemplate::llama3: return kBuiltinChatTemplate_llama3;
    case ChatTemplate::plain: return kBuiltinChatTemplate_plain;
    case ChatTemplate::qwen3: return kBuiltinChatTemplate_qwen3;
  }
  return {};
}

// The special tokens each built-in writes into the text.
std::vector<std::string_view> required_tokens(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::chatml:
    case ChatTemplate::qwen3: return {"<|im_start|>", "<|im_end|>"};
    case ChatTemplate::llama3: return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    case ChatTemplate::plain: return {};
  }
  return {};
}

// The directory of an hf tokenizer spec ("" for other kinds).
std::string tokenizer_directory(const std::string& spec) {
  const TokenizerSpec parsed = parse_tokenizer_spec(spec);
  return parsed.kind == "hf" ? parsed.path : std::string();
}

std::optional<nlohmann::json> read_tokenizer_config(const std::string& dir) {
  if (dir.empty()) return std::nullopt;
  const fs::path path = fs::path(dir) / "tokenizer_config.json";
  if (!fs::is_regular_file(path)) return std::nullopt;
  try {
    return nlohmann::json::parse(read_text_file(path.string(), "a tokenizer_config.json"));
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("{}: malformed JSON at byte {} (expected a tokenizer_config.json object)", path.string(), e.byte));
  }
}

// tokenizer_config.json's special tokens as transformers' special_tokens_map
// gives them to templates: strings, or AddedToken objects' "content"; null ones left out.
std::vector<std::pair<std::string, std::string>> config_special_tokens(const nlohmann::json& config) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!config.is_object()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    const nlohmann::json& value = config[key];
    if (value.is_string()) out.emplace_back(key, value.get<std::string>());
    else if (value.is_object() && value.contains("content") && value["content"].is_string())
      out.emplace_back(key, value["content"].get<std::string>());
  }
  return out;
}

const std::string* find_token(const std::vector<std::pair<std::string, std::string>>& tokens, std::string_view key) {
  for (const auto& [k, v] : tokens)
    if (k == key) return &v;
  return nullptr;
}

struct DirectoryTemplate {
  std::string source;
  std::string origin;
};

// The template a tokenizer directory carries: chat_template.jinja (which
// transformers prefers), else tokenizer_config.json's chat_template.
std::optional<DirectoryTemplate> directory_template(const std::string& dir, const std::optional<nlohmann::json>& config) {
  if (dir.empty()) return std::nullopt;
  const fs::path jinja_file = fs::path(dir) / "chat_template.jinja";
  if (fs::is_regular_file(jinja_file))
    return DirectoryTemplate{read_text_file(jinja_file.string(), "a Jinja chat template"), jinja_file.string()};
  if (!config || !config->is_object() || !config->contains("chat_template") || (*config)["chat_template"].is_null())
    return std::nullopt;
  const std::string where = (fs::path(dir) / "tokenizer_config.json").string();
  const nlohmann::json& value = (*config)["chat_template"];
  if (value.is_string()) return DirectoryTemplate{value.get<std::string>(), where};
  if (value.is_array()) {
    std::vector<std::string> names;
    for (const nlohmann::json& entry : value) {
      SHARDLM_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                        entry.contains("template") && entry["template"].is_string(),
                    "{}: chat_template entry {} (expected {{\"name\": ..., \"template\": ...}})", where, entry.dump().substr(0, 60));
      names.push_back(entry["name"].get<std::string>());
      if (names.back() == "default") return DirectoryTemplate{entry["template"].get<std::string>(), where + " (default)"};
    }
    throw Error(fmt::format("{}: chat_template lists templates {} but none named \"default\" (pass one with "
                            "--template FILE.jinja)", where, fmt::join(names, ", ")));
  }
  throw Error(fmt::format("{}: chat_template is {} (expected a string or a list of named templates)", where,
                          value.dump().substr(0, 60)));
}

int64_t parse_date(const std::string& date) {
  if (date.empty()) return static_cast<int64_t>(std::time(nullptr));
  std::tm tm{};
  int y = 0, m = 0, d = 0;
  char tail = 0;
  SHARDLM_CHECK(date.size() == 10 && std::sscanf(date.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &tail) == 3 && m >= 1 &&
                    m <= 12 && d >= 1 && d <= 31,
                "template date '{}' (expected YYYY-MM-DD)", date);
  tm.tm_year = y - 1900;
  tm.tm_mon = m - 1;
  tm.tm_mday = d;
  return static_cast<int64_t>(timegm(&tm));
}

std::string with_options(std::string id, const ChatTemplateOptions& options) {
  if (options.enable_thinking) id += *options.enable_thinking ? ",enable_thinking=true" : ",enable_thinking=false";
  return id;
}

jinja::Value message_value(const ChatMessage& message) {
  std::vector<std::pair<std::string, jinja::Value>> entries = {{"role", jinja::Value(std::string(chat_role_name(message.role)))},
                                                               {"content", jinja::Value(message.content)}};
  if (message.reasoning_content) entries.emplace_back("reasoning_content", jinja::Value(*message.reasoning_content));
  return jinja::make_object(std::move(entries));
}

bool starts_with(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Byte offset where each of `ids` starts in their decoded text, and the end.
std::vector<size_t> token_offsets(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::vector<size_t> offsets;
  size_t offset = 0;
  for (const int32_t& id : ids) {
    offsets.push_back(offset);
    offset += tokenizer.decode(std::span<const int32_t>(&id, 1)).size();
  }
  offsets.push_back(offset);
  return offsets;
}

bool is_added_token(const Tokenizer& tokenizer, int32_t id) {
  const std::string text = tokenizer.decode(std::span<const int32_t>(&id, 1));
  const std::optional<int32_t> found = tokenizer.special_token_id(text);
  return found && *found == id;
}

// `turn` up to the end of its last special (added) token, when it has one.
std::string cut_after_last_special_token(const Tokenizer& tokenizer, const std::string& turn) {
  const std::vector<int32_t> ids = tokenizer.encode(turn, SpecialTokens::recognized);
  const std::vector<size_t> offsets = token_offsets(tokenizer, ids);
  for (size_t i = ids.size(); i-- > 0;)
    if (is_added_token(tokenizer, ids[i])) return turn.substr(0, offsets[i + 1]);
  return turn;
}

// Template variables for a tokenizer: tokenizer_config.json's special tokens,
// then, where it names none (or there is no such file: tiktoken, gpt2:DIR), the
// tokenizer's own <|begin_of_text|> and end-of-text token.
std::vector<std::pair<std::string, std::string>> special_tokens_with_fallbacks(
    const Tokenizer& tokenizer, const std::optional<nlohmann::json>& config) {
  std::vector<std::pair<std::string, std::string>> tokens;
  if (config) tokens = config_special_tokens(*config);
  if (!find_token(tokens, "bos_token") && tokenizer.special_token_id("<|begin_of_text|>"))
    tokens.emplace_back("bos_token", "<|begin_of_text|>");
  if (!find_token(tokens, "eos_token") && tokenizer.end_of_text()) {
    const int32_t id[1] = {*tokenizer.end_of_text()};
    tokens.emplace_back("eos_token", tokenizer.decode(id));
  }
  return tokens;
}

}  // namespace

std::string_view chat_template_name(ChatTemplate chat_template) {
  switch (chat_template) {
    case ChatTemplate::chatml: return "chatml";
    case ChatTemplate::llama3: return "llama3";
    case ChatTemplate::plain: return "plain";
    case ChatTemplate::qwen3: return "qwen3";
  }
  return "?";
}

ChatTemplate parse_chat_template(std::string_view name) {
  for (ChatTemplate t : kBuiltins)
    if (name == chat_template_name(t)) return t;
  throw Error(fmt::format("unknown chat template '{}' (expected chatml, llama3, plain, qwen3 or a .jinja file)", name));
}

ChatTemplate default_chat_template(const Tokenizer& tokenizer) {
  auto has = [&](std::string_view text) { return tokenizer.special_token_id(text).has_value(); };
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatTemplate::chatml;
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>") && has("<|begin_of_text|>"))
    return ChatTemplate::llama3;
  return ChatTemplate::plain;
}

ChatFormat::ChatFormat(std::string id, std::string origin, std::string source,
                       std::vector<std::pair<std::string, std::string>> special_tokens, ChatTemplateOptions options)
    : id_(std::move(id)),
      origin_(std::move(origin)),
      source_(std::move(source)),
      special_tokens_(std::move(special_tokens)),
      options_(std::move(options)),
      now_(parse_date(options_.date)) {
  try {
    template_ = std::make_unique<jinja::Template>(source_);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", origin_, e.what()));
  }
}

ChatFormat::ChatFormat(ChatFormat&&) noexcept = default;
ChatFormat::~ChatFormat() = default;

std::string ChatFormat::render(const std::vector<ChatMessage>& messages, size_t count, bool add_generation_prompt) const {
  jinja::Array values;
  for (size_t i = 0; i < count && i < messages.size(); ++i) values.push_back(message_value(messages[i]));
  // What transformers' apply_chat_template passes: the messages, tools and
  // documents (None here), add_generation_prompt, the special tokens, the
  // caller's keyword arguments (enable_thinking) and the strftime_now global.
  jinja::Variables variables = {{"messages", jinja::Value(std::move(values))},
                                {"tools", jinja::Value::none()},
                                {"documents", jinja::Value::none()},
                                {"add_generation_prompt", jinja::Value(add_generation_prompt)},
                                {"strftime_now", jinja::strftime_now_at(now_)}};
  for (const auto& [key, text] : special_tokens_) variables.emplace_back(key, jinja::Value(text));
  if (options_.enable_thinking) variables.emplace_back("enable_thinking", jinja::Value(*options_.enable_thinking));
  try {
    return template_->render(variables);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", origin_, e.what()));
  }
}

ChatFormat builtin_chat_format(ChatTemplate chat_template, const Tokenizer& tokenizer, const std::string& tokenizer_dir,
                               const ChatTemplateOptions& options) {
  const std::string name(chat_template_name(chat_template));
  for (std::string_view text : required_tokens(chat_template))
    SHARDLM_CHECK(tokenizer.special_token_id(text).has_value(),
                  "chat template {} needs the special token {}, which tokenizer {} does not have", name, text,
                  tokenizer.spec());
  std::vector<std::pair<std::string, std::string>> tokens =
      special_tokens_with_fallbacks(tokenizer, read_tokenizer_config(tokenizer_dir));
  if (chat_template == ChatTemplate::plain)
    SHARDLM_CHECK(find_token(tokens, "eos_token"), "chat template plain ends assistant turns with the end-of-text "
                  "token, which tokenizer {} does not have", tokenizer.spec());
  if (chat_template == ChatTemplate::llama3)
    SHARDLM_CHECK(find_token(tokens, "bos_token") && *find_token(tokens, "bos_token") == "<|begin_of_text|>",
                  "chat template llama3 starts with <|begin_of_text|>, but tokenizer {} names bos_token {}",
                  tokenizer.spec(), find_token(tokens, "bos_token") ? *find_token(tokens, "bos_token") : "none");
  return ChatFormat(with_options(name, options), name, std::string(builtin_source(chat_template)), std::move(tokens),
                    options);
}

ChatFormat resolve_chat_format(const std::string& choice, const Tokenizer& tokenizer, const ChatTemplateOptions& options) {
  const std::string dir = tokenizer_directory(tokenizer.spec());
  const bool is_file = choice.size() > 6 && choice.compare(choice.size() - 6, 6, ".jinja") == 0;
  if (!choice.empty() && !is_file) return builtin_chat_format(parse_chat_template(choice), tokenizer, dir, options);
  const std::optional<nlohmann::json> config = read_tokenizer_config(dir);
  std::optional<DirectoryTemplate> found;
  if (is_file) {
    SHARDLM_CHECK(fs::is_regular_file(choice), "--template {}: no such file (expected a Jinja chat template)", choice);
    found = DirectoryTemplate{read_text_file(choice, "a Jinja chat template"), choice};
  } else {
    found = directory_template(dir, config);
    if (!found) return builtin_chat_format(default_chat_template(tokenizer), tokenizer, dir, options);
  }
  // A directory's own template sees exactly transformers' variables; a file
  // given with --template also the tokenizer's own tokens where the config names none.
  std::vector<std::pair<std::string, std::string>> tokens =
      is_file ? special_tokens_with_fallbacks(tokenizer, config) : config_special_tokens(*config);
  const std::string id = "sha256:" + sha256_hex(found->source.data(), found->source.size());
  return ChatFormat(with_options(id, options), found->origin, std::move(found->source), std::move(tokens), options);
}

std::string_view python_strip(std::string_view text) {
  size_t begin = text.size(), end = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t at = pos;
    const std::optional<char32_t> cp = utf8::decode(text, pos);
    if (!cp) ++pos;
    if (!cp || !jinja::is_python_space(*cp)) {
      begin = std::min(begin, at);
      end = pos;
    }
  }
  return begin >= end ? std::string_view() : text.substr(begin, end - begin);
}

TokenizedChat tokenize_chat(const Tokenizer& tokenizer, const ChatFormat& format, const Conversation& conversation) {
  std::vector<ChatMessage> messages = conversation.messages;
  const bool reads_reasoning = format.source().find("reasoning_content") != std::string::npos;
  for (size_t i = 0; i < messages.size(); ++i) {
    ChatMessage& m = messages[i];
    m.content = tokenizer.normalize(m.content);
    if (m.reasoning_content) {
      SHARDLM_CHECK(reads_reasoning || m.reasoning_content->empty(),
                    "message {} has reasoning_content, which chat template {} never renders (expected a template "
                    "with a think block, e.g. --template qwen3, or data without reasoning_content)", i, format.origin());
      m.reasoning_content = tokenizer.normalize(*m.reasoning_content);
    }
  }
  const size_t n = messages.size();
  TokenizedChat out;
  out.text = format.render(messages, n, /*add_generation_prompt=*/false);
  out.ids = tokenizer.encode(out.text, SpecialTokens::recognized);
  const std::vector<size_t> offsets = token_offsets(tokenizer, out.ids);
  SHARDLM_CHECK(offsets.back() == out.text.size() && tokenizer.decode(out.ids) == out.text,
                "chat template {}: tokenizer {} does not give the rendered text back (its normalizer changes text "
                "the template wrote around the messages)", format.origin(), tokenizer.spec());

  // Each assistant turn's span in out.text (rule at the top of the header).
  std::vector<std::pair<size_t, size_t>> spans;
  size_t previous_end = 0;
  for (size_t i = 0; i < n; ++i) {
    if (messages[i].role != ChatRole::assistant) continue;
    const std::string where = fmt::format("chat template {}, assistant message {}", format.origin(), i);
    const std::string prompt = format.render(messages, i, /*add_generation_prompt=*/true);
    const std::string as_last = format.render(messages, i + 1, /*add_generation_prompt=*/false);
    SHARDLM_CHECK(starts_with(as_last, prompt), "{}: the conversation ending with this turn does not start with the "
                  "generation prompt rendered before it (the template is not prefix-stable, or the data contradicts "
                  "the prompt, e.g. reasoning_content with --enable-thinking false; loss masks cannot be found by "
                  "rendering)", where);
    const std::string turn = cut_after_last_special_token(tokenizer, as_last.substr(prompt.size()));
    const std::string history = format.render(messages, i, /*add_generation_prompt=*/false);
    const size_t start = common_prefix(prompt, out.text);
    SHARDLM_CHECK(!starts_with(prompt, history) || start >= history.size(),
                  "{}: the messages before this turn render differently once later messages follow (the template is "
                  "not prefix-stable; loss masks cannot be found by rendering)", where);
    SHARDLM_CHECK(start >= previous_end, "{}: the turn starts inside the previous assistant turn", where);
    // The longest tail of the turn the full text holds at `start`.
    size_t length = turn.size();
    while (length > 0 && out.text.compare(start, length, turn, turn.size() - length, length) != 0) --length;
    SHARDLM_CHECK(length > 0 || turn.empty(), "{}: the conversation's text does not hold the turn (as the template "
                  "renders it at the end of a conversation) where the turn starts", where);
    spans.emplace_back(start, start + length);
    previous_end = start + length;
  }
  out.targets.assign(out.ids.size(), 0);
  size_t span = 0;
  for (size_t t = 0; t < out.ids.size(); ++t) {
    while (span < spans.size() && offsets[t] >= spans[span].second) ++span;
    if (span < spans.size() && offsets[t] >= spans[span].first) out.targets[t] = 1;
  }
  return out;
}

TokenizedChat tokenize_chat(const Tokenizer& tokenizer, ChatTemplate chat_template, const Conversation& conversation) {
  return tokenize_chat(tokenizer, builtin_chat_format(chat_template, tokenizer, tokenizer_directory(tokenizer.spec()), {}),
                       conversation);
}

}  // namespace shardlm
