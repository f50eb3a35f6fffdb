#include "shardlm/data/hf_tokenizer.hpp"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/byte_level_unicode.hpp"
#include "shardlm/data/gpt2_pretokenizer.hpp"
#include "shardlm/data/unicode_nfc.hpp"

namespace shardlm {
namespace {

constexpr size_t kWordsPerBatch = 1 << 16;

std::string tokenizer_json_path(const std::string& dir) { return dir + "/tokenizer.json"; }
std::string tokenizer_config_path(const std::string& dir) { return dir + "/tokenizer_config.json"; }

// The bytes Hugging Face's ByteLevel decoder gives for an added token: its text
// read through the byte-level alphabet when every character belongs to it, else
// its UTF-8 text as it is.
std::string added_token_bytes(const std::string& content) {
  std::optional<std::string> mapped = gpt2::token_text_to_bytes(content);
  return mapped ? *mapped : content;
}

// Text as a JSON string: control characters escaped, so messages stay on one line.
std::string quoted(const std::string& text) { return nlohmann::json(text).dump(); }

// eos_token of tokenizer_config.json ("<|im_end|>" or {"content": "<|im_end|>", ...}), if any.
std::optional<std::string> config_eos_token(const std::string& dir) {
  const std::string path = tokenizer_config_path(dir);
  if (!std::filesystem::exists(path)) return std::nullopt;
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_text_file(path, "a Hugging Face tokenizer_config.json"));
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("tokenizer file {} is not valid JSON at byte {} (expected a Hugging Face "
                            "tokenizer_config.json)", path, e.byte));
  }
  if (!config.is_object() || !config.contains("eos_token")) return std::nullopt;
  const nlohmann::json& eos = config["eos_token"];
  if (eos.is_string()) return eos.get<std::string>();
  if (eos.is_object() && eos.contains("content") && eos["content"].is_string()) return eos["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

// One Split pre-tokenizer: the regex's matches and the stretches between them,
// flagged (flags swapped by invert), grouped into pieces by the behavior exactly
// as tokenizers' NormalizedString::split does, in a single streaming pass.
struct HfTokenizer::SplitStep {
  SplitStep(const HfPreTokenizerStep& step, const std::string& path)
      : regex(step.pattern, "tokenizer file " + path + ": pre_tokenizer Split pattern"),
        behavior(step.behavior),
        invert(step.invert) {}

  template <typename Emit>
  void split(std::string_view text, Emit&& emit) const {
    // pending: a piece that a later segment may still extend (behavior-dependent).
    std::optional<TextSpan> pending;
    bool pending_is_match = false;
    bool previous_match = false;
    bool first = true;
    auto flush = [&] {
      if (pending && pending->end > pending->begin) emit(text.substr(pending->begin, pending->end - pending->begin));
      pending.reset();
    };
    auto segment = [&](TextSpan span, bool is_match) {
      is_match = is_match != invert;
      switch (behavior) {
        case SplitBehavior::isolated:
          emit(text.substr(span.begin, span.end - span.begin));
          break;
        case SplitBehavior::removed:
          if (!is_match) emit(text.substr(span.begin, span.end - span.begin));
          break;
        case SplitBehavior::merged_with_previous:  // a delimiter joins the piece before it
          if (is_match && !previous_match && pending) {
            pending->end = span.end;
          } else {
            flush();
            pending = span;
          }
          break;
        case SplitBehavior::contiguous:  // runs of equal flags form one piece
          if (!first && is_match == previous_match && pending) {
            pending->end = span.end;
          } else {
            flush();
            pending = span;
          }
          break;
        case SplitBehavior::merged_with_next:  // a delimiter joins the piece after it
          if (pending && pending_is_match && !is_match) {
            pending->end = span.end;
            flush();
          } else {
            flush();
            if (is_match) {
              pending = span;
              pending_is_match = true;
            } else {
              emit(text.substr(span.begin, span.end - span.begin));
            }
          }
          break;
      }
      previous_match = is_match;
      first = false;
    };
    std::vector<TextSpan> matches;
    size_t cursor = 0;
    while (cursor < text.size()) {
      matches.clear();
      const size_t next = regex.find_matches(text, cursor, matches, kWordsPerBatch);
      for (const TextSpan& m : matches) {
        if (m.begin > cursor) segment({cursor, m.begin}, false);
        segment(m, true);
        cursor = m.end;
      }
      if (next == text.size() && cursor < text.size()) {
        segment({cursor, text.size()}, false);
        cursor = text.size();
      }
    }
    flush();
  }

  Pcre2Regex regex;
  SplitBehavior behavior;
  bool invert;
};

std::string hf_tokenizer_files_sha256(const std::string& dir) {
  Sha256 hash;
  const std::string json = read_text_file(tokenizer_json_path(dir), "a Hugging Face tokenizer.json");
  hash.update(json.data(), json.size());
  if (std::filesystem::exists(tokenizer_config_path(dir))) {
    const std::string config = read_text_file(tokenizer_config_path(dir), "a Hugging Face tokenizer_config.json");
    hash.update(config.data(), config.size());
  }
  return hash.hex_digest();
}

HfTokenizer::HfTokenizer(const std::string& dir, const std::string& expected_sha256)
    : dir_(std::filesystem::absolute(dir).lexically_normal().string()) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  const std::string path = tokenizer_json_path(dir_);
  SHARDLM_CHECK(std::filesystem::is_regular_file(path),
                "tokenizer directory {} has no tokenizer.json (expected a Hugging Face tokenizer directory)", dir_);
  sha256_ = hf_tokenizer_files_sha256(dir_);
  SHARDLM_CHECK(expected_sha256.empty() || expected_sha256 == sha256_,
                "tokenizer files in {} changed since the data was prepared: sha256 of tokenizer.json + "
                "tokenizer_config.json is {}, the spec expects {}",
                dir_, sha256_, expected_sha256);
  const HfTokenizerJson file = read_hf_tokenizer_json(path);
  build_vocabulary(file, path);
  build_merges(file, path);
  if (file.ignore_merges) words_.whole_words = &id_of_bytes_;
  nfc_ = file.nfc;
  for (const HfPreTokenizerStep& step : file.pre_tokenizer) {
    if (step.kind == HfPreTokenizerStep::Kind::split) {
      splits_.push_back(std::make_unique<SplitStep>(step, path));
    } else {
      add_prefix_space_ = step.add_prefix_space;
      if (step.use_regex) byte_level_regex_ = std::make_unique<Pcre2Regex>(gpt2::kPattern, "GPT-2 pre-tokenizer regex");
    }
  }
  for (const std::vector<int32_t>* ids : {&file.prefix_ids, &file.suffix_ids})
    for (int32_t id : *ids)
      SHARDLM_CHECK(id < vocab_size() && !token_bytes_[id].empty(), "tokenizer file {}: post_processor adds id {}, "
                    "which is not in the vocabulary", path, id);
  frame_ = {file.prefix_ids, file.suffix_ids};
  const std::optional<std::string> config_eos = config_eos_token(dir_);  // also checks the file
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>"})
    if (!end_of_text_) end_of_text_ = special_token_id(name);
  if (!end_of_text_ && config_eos) end_of_text_ = special_token_id(*config_eos);
}

HfTokenizer::~HfTokenizer() = default;

void HfTokenizer::build_vocabulary(const HfTokenizerJson& file, const std::string& path) {
  int64_t size = 0;
  for (const auto& [text, id] : file.vocab) size = std::max<int64_t>(size, int64_t{id} + 1);
  for (const HfAddedToken& token : file.added_tokens) size = std::max<int64_t>(size, int64_t{token.id} + 1);
  SHARDLM_CHECK(size <= INT32_MAX, "tokenizer file {}: ids up to {} (expected fewer than 2^31)", path, size - 1);
  token_bytes_.assign(static_cast<size_t>(size), std::string());
  id_of_bytes_.reserve(file.vocab.size());
  for (const auto& [text, id] : file.vocab) {
    SHARDLM_CHECK(token_bytes_[id].empty(), "tokenizer file {}: model.vocab uses id {} twice (expected each id once)", path, id);
    std::optional<std::string> bytes = gpt2::token_text_to_bytes(text);
    SHARDLM_CHECK(bytes.has_value() && !bytes->empty(),
                  "tokenizer file {}: model.vocab token {} (id {}) is not spelled in the byte-level alphabet "
                  "(expected a byte-level BPE vocabulary)", path, quoted(text), id);
    token_bytes_[id] = *bytes;
    id_of_bytes_.emplace(std::move(*bytes), id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_bytes_.find(std::string(1, static_cast<char>(b)));
    SHARDLM_CHECK(it != id_of_bytes_.end(),
                  "tokenizer file {}: model.vocab has no token for byte {} (expected all 256 single-byte tokens "
                  "of a byte-level BPE)", path, b);
    words_.byte_ids[b] = it->second;
  }
  for (const HfAddedToken& token : file.added_tokens) {
    token_bytes_[token.id] = added_token_bytes(token.content);
    added_id_of_text_.try_emplace(token.content, token.id);
    if (token.special) special_ids_.insert(token.id);
    if (token.normalized)
      normalized_added_.add(nfc_ ? nfc_normalize(token.content) : token.content, token.id);
    else
      raw_added_.add(token.content, token.id);
  }
}

void HfTokenizer::build_merges(const HfTokenizerJson& file, const std::string& path) {
  words_.merges.reserve(file.merges.size());
  auto id_of = [&](const std::string& text, size_t index, std::string& bytes) {
    std::optional<std::string> decoded = gpt2::token_text_to_bytes(text);
    const auto it = decoded ? id_of_bytes_.find(*decoded) : id_of_bytes_.end();
    SHARDLM_CHECK(it != id_of_bytes_.end(), "tokenizer file {}: model.merges[{}] names {}, which is not in "
                  "model.vocab (expected merges of vocabulary tokens)", path, index, quoted(text));
    bytes += *decoded;
    return it->second;
  };
  for (size_t i = 0; i < file.merges.size(); ++i) {
    std::string merged;
    const int32_t left = id_of(file.merges[i].first, i, merged);
    const int32_t right = id_of(file.merges[i].second, i, merged);
    const auto it = id_of_bytes_.find(merged);
    SHARDLM_CHECK(it != id_of_bytes_.end(), "tokenizer file {}: model.merges[{}] ({} {}) makes a token that "
                  "is not in model.vocab", path, i, quoted(file.merges[i].first), quoted(file.merges[i].second));
    words_.merges.add(left, right, static_cast<int32_t>(i), it->second, BpeMerges::Duplicate::last_wins);
  }
}

std::string HfTokenizer::spec() const { return "hf:" + dir_ + "#sha256=" + sha256_; }

std::optional<int32_t> HfTokenizer::special_token_id(std::string_view text) const {
  const auto it = added_id_of_text_.find(std::string(text));
  return it == added_id_of_text_.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

std::string HfTokenizer::normalize(std::string_view text) const {
  return nfc_ ? nfc_normalize(text) : std::string(text);
}

namespace {

// Added-token matches of `text`; special tokens dropped (left as text) unless
// recognized, as tokenizers' encode_special_tokens does after matching.
std::vector<AddedTokenMatch> added_matches(const AddedTokenMatcher& matcher, std::string_view text,
                                           SpecialTokens specials, const std::unordered_set<int32_t>& special_ids) {
  std::vector<AddedTokenMatch> matches;
  matcher.find_all(text, matches);
  if (specials == SpecialTokens::as_text)
    std::erase_if(matches, [&](const AddedTokenMatch& m) { return special_ids.contains(m.id); });
  return matches;
}

template <typename EncodePiece>
void encode_between(std::string_view text, const std::vector<AddedTokenMatch>& matches, std::vector<int32_t>& ids,
                    EncodePiece&& encode_piece) {
  size_t cursor = 0;
  for (const AddedTokenMatch& match : matches) {
    if (match.begin > cursor) encode_piece(text.substr(cursor, match.begin - cursor));
    ids.push_back(match.id);
    cursor = match.end;
  }
  if (cursor < text.size()) encode_piece(text.substr(cursor));
}

}  // namespace

std::vector<int32_t> HfTokenizer::encode_text(std::string_view text, SpecialTokens specials) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  encode_between(text, added_matches(raw_added_, text, specials, special_ids_), ids, [&](std::string_view piece) {
    if (nfc_) {
      const std::string normalized = nfc_normalize(piece);
      encode_normalized_piece(normalized, specials, ids);
    } else {
      encode_normalized_piece(piece, specials, ids);
    }
  });
  return ids;
}

void HfTokenizer::encode_normalized_piece(std::string_view piece, SpecialTokens specials,
                                          std::vector<int32_t>& ids) const {
  encode_between(piece, added_matches(normalized_added_, piece, specials, special_ids_), ids,
                 [&](std::string_view rest) { encode_pre_tokenized(rest, ids); });
}

void HfTokenizer::encode_pre_tokenized(std::string_view piece, std::vector<int32_t>& ids) const {
  // Split steps in order, each applied to every piece of the one before, then ByteLevel.
  auto run = [&](auto& self, std::string_view text, size_t step) -> void {
    if (step < splits_.size()) {
      splits_[step]->split(text, [&](std::string_view sub) { self(self, sub, step + 1); });
      return;
    }
    std::string prefixed;
    if (add_prefix_space_ && !text.starts_with(' ')) {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    if (byte_level_regex_)
      words_.encode_split(*byte_level_regex_, text, ids);
    else
      words_.encode(text, ids);
  };
  run(run, piece, 0);
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  return concatenate_token_bytes(ids, token_bytes_, "tokenizer " + dir_);
}

}  // namespace shardlm
