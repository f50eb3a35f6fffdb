#include "shardlm/data/hf_tokenizer_json.hpp"

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include <cctype>

namespace shardlm {
namespace {

using nlohmann::json;

// Reads one tokenizer.json, naming the file and the JSON path of every problem.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& problem) const {
    throw Error(fmt::format("tokenizer file {}: {} {}", path_, where, problem));
  }
  [[noreturn]] void unsupported(const std::string& where, const json& value, std::string_view expected) const {
    fail(where, fmt::format("is {}, which shardlm does not implement (expected {})", short_dump(value), expected));
  }
  static std::string short_dump(const json& value) {
    std::string text = value.dump();
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    return text;
  }

  const json& member(const json& object, const std::string& where, const char* key) const {
    if (!object.contains(key)) fail(where + "." + key, "is missing");
    return object.at(key);
  }
  std::string type_of(const json& object, const std::string& where) const {
    if (!object.is_object()) fail(where, fmt::format("is {} (expected an object with a \"type\")", short_dump(object)));
    const json& type = member(object, where, "type");
    if (!type.is_string()) fail(where + ".type", fmt::format("is {} (expected a string)", short_dump(type)));
    return type.get<std::string>();
  }
  bool flag(const json& object, const std::string& where, const char* key, bool fallback) const {
    if (!object.contains(key) || object.at(key).is_null()) return fallback;
    const json& value = object.at(key);
    if (!value.is_boolean()) fail(where + "." + key, fmt::format("is {} (expected true or false)", short_dump(value)));
    return value.get<bool>();
  }
  // Keys that may be present but must have one of the harmless values.
  void require_value(const json& object, const std::string& where, const char* key,
                     std::initializer_list<json> harmless, std::string_view expected) const {
    if (!object.contains(key)) return;
    const json& value = object.at(key);
    for (const json& ok : harmless)
      if (value == ok) return;
    unsupported(where + "." + key, value, expected);
  }
  // Calls read(item, its path) for each item of a Sequence's array `key`.
  template <typename Read>
  void each_in_sequence(const json& sequence, const std::string& where, const char* key, Read&& read) const {
    const json& items = member(sequence, where, key);
    if (!items.is_array()) fail(where + "." + key, "is not an array");
    for (size_t i = 0; i < items.size(); ++i) read(items[i], fmt::format("{}.{}[{}]", where, key, i));
  }
  int32_t token_id(const json& id, const std::string& where) const {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      fail(where, fmt::format("is {} (expected a token id)", short_dump(id)));
    return id.get<int32_t>();
  }
  void only_keys(const json& object, const std::string& where, std::initializer_list<const char*> keys) const {
    for (const auto& [key, value] : object.items()) {
      bool known = false;
      for (const char* k : keys) known = known || key == k;
      if (!known) unsupported(where + "." + key, value, "no such field");
    }
  }

  void read_model(const json& model, HfTokenizerJson& out) const;
  void read_normalizer(const json& normalizer, const std::string& where, HfTokenizerJson& out) const;
  void read_pre_tokenizer(const json& pre, const std::string& where, HfTokenizerJson& out) const;
  void read_post_processor(const json& post, const std::string& where, HfTokenizerJson& out) const;
  void read_decoder(const json& decoder) const;
  void read_added_tokens(const json& added, HfTokenizerJson& out) const;

 private:
  std::string path_;
};

void Reader::read_model(const json& model, HfTokenizerJson& out) const {
  const std::string where = "model";
  if (!model.is_object()) fail(where, fmt::format("is {} (expected a BPE model object)", short_dump(model)));
  // Files written by old versions of tokenizers have no "type" in the model.
  if (model.contains("type") && type_of(model, where) != "BPE")
    unsupported(where + ".type", model.at("type"), "\"BPE\" (a byte-level BPE model)");
  only_keys(model, where, {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                           "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
  require_value(model, where, "dropout", {nullptr}, "null: BPE dropout is not implemented");
  require_value(model, where, "continuing_subword_prefix", {nullptr, ""}, "null or \"\"");
  require_value(model, where, "end_of_word_suffix", {nullptr, ""}, "null or \"\"");
  require_value(model, where, "byte_fallback", {nullptr, false}, "false: byte fallback is not implemented");
  // unk_token and fuse_unk never matter: every byte has a token (checked on load).
  out.ignore_merges = flag(model, where, "ignore_merges", false);

  const json& vocab = member(model, where, "vocab");
  if (!vocab.is_object() || vocab.empty())
    fail(where + ".vocab", fmt::format("is {} (expected an object mapping token text to id)",
                                       vocab.is_object() ? "an empty object" : vocab.type_name()));
  out.vocab.reserve(vocab.size());
  for (const auto& [text, id] : vocab.items())
    out.vocab.emplace_back(text, token_id(id, where + ".vocab[" + json(text).dump() + "]"));
  const json& merges = member(model, where, "merges");
  if (!merges.is_array()) fail(where + ".merges", fmt::format("is {} (expected an array)", merges.type_name()));
  out.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    const std::string at = fmt::format("{}.merges[{}]", where, i);
    if (merge.is_string()) {  // "a b"
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= text.size() ||
          text.find(' ', space + 1) != std::string::npos)
        fail(at, fmt::format("is {} (expected two tokens separated by one space)", short_dump(merge)));
      out.merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      out.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      fail(at, fmt::format("is {} (expected \"a b\" or [\"a\", \"b\"])", short_dump(merge)));
    }
  }
}

void Reader::read_normalizer(const json& normalizer, const std::string& where, HfTokenizerJson& out) const {
  if (normalizer.is_null()) return;
  const std::string type = type_of(normalizer, where);
  if (type == "NFC") {
    out.nfc = true;
  } else if (type == "Sequence") {
    each_in_sequence(normalizer, where, "normalizers",
                     [&](const json& step, const std::string& at) { read_normalizer(step, at, out); });
  } else {
    unsupported(where + ".type", normalizer.at("type"), "null, \"NFC\" or a \"Sequence\" of them");
  }
}

std::string escape_literal(const std::string& text) {
  std::string pattern;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u) && c != ' ') pattern.push_back('\\');
    pattern.push_back(c);
  }
  return pattern;
}

void Reader::read_pre_tokenizer(const json& pre, const std::string& where, HfTokenizerJson& out) const {
  if (pre.is_null()) return;
  const std::string type = type_of(pre, where);
  if (!out.pre_tokenizer.empty() && out.pre_tokenizer.back().kind == HfPreTokenizerStep::Kind::byte_level)
    fail(where, "follows a ByteLevel step (expected ByteLevel to be the last pre-tokenizer)");
  HfPreTokenizerStep step;
  if (type == "Sequence") {
    each_in_sequence(pre, where, "pretokenizers",
                     [&](const json& step, const std::string& at) { read_pre_tokenizer(step, at, out); });
    return;
  } else if (type == "ByteLevel") {
    only_keys(pre, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    step.kind = HfPreTokenizerStep::Kind::byte_level;
    step.add_prefix_space = flag(pre, where, "add_prefix_space", true);
    step.use_regex = flag(pre, where, "use_regex", true);
  } else if (type == "Split") {
    only_keys(pre, where, {"type", "pattern", "behavior", "invert"});
    const json& pattern = member(pre, where, "pattern");
    if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") && pattern["Regex"].is_string())
      step.pattern = pattern["Regex"].get<std::string>();
    else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String") && pattern["String"].is_string())
      step.pattern = escape_literal(pattern["String"].get<std::string>());
    else
      fail(where + ".pattern", fmt::format("is {} (expected {{\"Regex\": ...}} or {{\"String\": ...}})",
                                           short_dump(pattern)));
    if (step.pattern.empty()) fail(where + ".pattern", "is empty");
    const json& behavior = member(pre, where, "behavior");
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::removed},
        {"Isolated", SplitBehavior::isolated},
        {"MergedWithPrevious", SplitBehavior::merged_with_previous},
        {"MergedWithNext", SplitBehavior::merged_with_next},
        {"Contiguous", SplitBehavior::contiguous}};
    bool known = false;
    for (const auto& [name, value] : kBehaviors)
      if (behavior == name) {
        step.behavior = value;
        known = true;
      }
    if (!known)
      fail(where + ".behavior", fmt::format("is {} (expected Removed, Isolated, MergedWithPrevious, "
                                            "MergedWithNext or Contiguous)", short_dump(behavior)));
    step.invert = flag(pre, where, "invert", false);
  } else {
    unsupported(where + ".type", pre.at("type"), "\"ByteLevel\", \"Split\" or a \"Sequence\" of them");
  }
  out.pre_tokenizer.push_back(std::move(step));
}

void Reader::read_post_processor(const json& post, const std::string& where, HfTokenizerJson& out) const {
  if (post.is_null()) return;
  const std::string type = type_of(post, where);
  if (type == "ByteLevel") return;  // only trims offsets; adds no tokens
  if (type == "Sequence") {
    each_in_sequence(post, where, "processors",
                     [&](const json& step, const std::string& at) { read_post_processor(step, at, out); });
    return;
  }
  if (type != "TemplateProcessing")
    unsupported(where + ".type", post.at("type"), "null, \"ByteLevel\", \"TemplateProcessing\" or a \"Sequence\"");
  if (!out.prefix_ids.empty() || !out.suffix_ids.empty()) fail(where, "is a second TemplateProcessing");
  const json& single = member(post, where, "single");
  const json& specials = member(post, where, "special_tokens");
  if (!single.is_array()) fail(where + ".single", "is not an array");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& item = single[i];
    const std::string at = fmt::format("{}.single[{}]", where, i);
    if (item.is_object() && item.contains("Sequence")) {
      if (seen_sequence || item["Sequence"].value("id", "") != "A")
        fail(at, fmt::format("is {} (expected the one sequence $A)", short_dump(item)));
      seen_sequence = true;
    } else if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
      const json& name = item["SpecialToken"]["id"];
      if (!name.is_string() || !specials.contains(name.get<std::string>()))
        fail(at, fmt::format("names {}, which is not in {}.special_tokens", short_dump(name), where));
      const json& ids = specials[name.get<std::string>()].value("ids", json());
      if (!ids.is_array() || ids.empty())
        fail(where + ".special_tokens", fmt::format("entry {} has no \"ids\" array", short_dump(name)));
      for (const json& id : ids)
        (seen_sequence ? out.suffix_ids : out.prefix_ids)
            .push_back(token_id(id, where + ".special_tokens[" + short_dump(name) + "].ids"));
    } else {
      fail(at, fmt::format("is {} (expected {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}})", short_dump(item)));
    }
  }
  if (!seen_sequence) fail(where + ".single", "has no sequence $A");
}

void Reader::read_decoder(const json& decoder) const {
  if (decoder.is_null()) return;
  if (type_of(decoder, "decoder") != "ByteLevel")
    unsupported("decoder.type", decoder.at("type"), "null or \"ByteLevel\"");
}

void Reader::read_added_tokens(const json& added, HfTokenizerJson& out) const {
  if (added.is_null()) return;
  if (!added.is_array()) fail("added_tokens", fmt::format("is {} (expected an array)", added.type_name()));
  for (size_t i = 0; i < added.size(); ++i) {
    const json& token = added[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    if (!token.is_object()) fail(where, "is not an object");
    only_keys(token, where, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    const int32_t id = token_id(member(token, where, "id"), where + ".id");
    const json& content = member(token, where, "content");
    if (!content.is_string() || content.get_ref<const std::string&>().empty())
      fail(where + ".content", fmt::format("is {} (expected a non-empty string)", short_dump(content)));
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (flag(token, where, key, false))
        unsupported(where + "." + key, true, "false: stripping and word boundaries are not implemented");
    HfAddedToken parsed;
    parsed.id = id;
    parsed.content = content.get<std::string>();
    parsed.special = flag(token, where, "special", false);
    // tokenizers' default for an AddedToken is normalized = !special.
    parsed.normalized = flag(token, where, "normalized", !parsed.special);
    out.added_tokens.push_back(std::move(parsed));
  }
}

}  // namespace

HfTokenizerJson read_hf_tokenizer_json(const std::string& path) {
  const std::string text = read_text_file(path, "a Hugging Face tokenizer.json");
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("tokenizer file {} is not valid JSON at byte {} (expected a Hugging Face tokenizer.json)",
                            path, e.byte));
  }
  Reader reader(path);
  if (!root.is_object()) reader.fail("top level", fmt::format("is {} (expected an object)", root.type_name()));
  reader.only_keys(root, "top level", {"version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "post_processor", "decoder", "model"});
  reader.require_value(root, "top level", "truncation", {nullptr}, "null: truncation is the caller's business");
  reader.require_value(root, "top level", "padding", {nullptr}, "null: padding is the caller's business");
  HfTokenizerJson out;
  reader.read_model(reader.member(root, "top level", "model"), out);
  reader.read_normalizer(root.value("normalizer", json()), "normalizer", out);
  reader.read_pre_tokenizer(root.value("pre_tokenizer", json()), "pre_tokenizer", out);
  reader.read_post_processor(root.value("post_processor", json()), "post_processor", out);
  reader.read_decoder(root.value("decoder", json()));
  reader.read_added_tokens(root.value("added_tokens", json()), out);
  if (out.pre_tokenizer.empty() || out.pre_tokenizer.back().kind != HfPreTokenizerStep::Kind::byte_level)
    reader.fail("pre_tokenizer", "has no ByteLevel step (expected a byte-level BPE tokenizer: ByteLevel, or a "
                "Sequence of Splits ending in ByteLevel)");
  return out;
}

}  // namespace shardlm
