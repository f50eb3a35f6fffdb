#include "shardlm/data/tiktoken_tokenizer.hpp"

#include <filesystem>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/text_lines.hpp"
#include "shardlm/data/unicode_nfc.hpp"

namespace shardlm {
namespace {

std::vector<TiktokenPreset> make_presets() {
  TiktokenPreset qwen;
  qwen.name = "qwen";
  qwen.pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  int32_t id = 151643;
  for (const char* name : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) qwen.special_tokens.emplace_back(name, id++);
  for (int i = 0; i < 205; ++i) qwen.special_tokens.emplace_back(fmt::format("<|extra_{}|>", i), id++);
  qwen.end_of_text = "<|endoftext|>";
  qwen.nfc = true;
  return {qwen};
}

// Standard base64 (RFC 4648) with optional padding; nullopt when malformed.
std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  return out;
}

}  // namespace

const TiktokenPreset& tiktoken_preset(const std::string& name) {
  static const std::vector<TiktokenPreset> presets = make_presets();
  for (const TiktokenPreset& preset : presets)
    if (preset.name == name) return preset;
  throw Error(fmt::format("unknown tiktoken preset '{}' (expected qwen)", name));
}

TiktokenTokenizer::TiktokenTokenizer(const std::string& path, const TiktokenPreset& preset,
                                     const std::string& expected_sha256)
    : path_(std::filesystem::absolute(path).lexically_normal().string()),
      preset_(preset),
      regex_(preset.pattern, "tiktoken preset " + preset.name + " regex") {
  SHARDLM_CHECK(std::filesystem::is_regular_file(path_), "tiktoken rank file {} does not exist (expected lines "
                "'BASE64 rank')", path_);
  const std::string content = read_text_file(path_, "a tiktoken rank file");
  sha256_ = sha256_hex(content.data(), content.size());
  SHARDLM_CHECK(expected_sha256.empty() || expected_sha256 == sha256_,
                "tiktoken rank file {} changed since the data was prepared: sha256 {}, the spec expects {}", path_,
                sha256_, expected_sha256);
  load_ranks(content);
  for (const auto& [text, id] : preset_.special_tokens) {
    SHARDLM_CHECK(static_cast<size_t>(id) >= rank_count_,
                  "tiktoken rank file {} has {} ranks, which overlap preset {}'s special token {} = {}", path_,
                  rank_count_, preset_.name, text, id);
    if (token_bytes_.size() <= static_cast<size_t>(id)) token_bytes_.resize(static_cast<size_t>(id) + 1);
    token_bytes_[id] = text;
    special_tokens_.add(text, id);
  }
  end_of_text_ = special_token_id(preset_.end_of_text);
}

void TiktokenTokenizer::load_ranks(const std::string& content) {
  std::vector<bool> seen;
  for_each_line(content, [&](int line_number, std::string_view line) {
    if (line.empty()) return;
    const size_t space = line.find(' ');
    std::optional<std::string> bytes =
        space == std::string_view::npos ? std::nullopt : base64_decode(line.substr(0, space));
    int64_t rank = -1;
    if (space != std::string_view::npos) {
      const std::string_view number = line.substr(space + 1);
      if (!number.empty() && number.size() < 11 && number.find_first_not_of("0123456789") == std::string_view::npos)
        rank = std::stoll(std::string(number));
    }
    SHARDLM_CHECK(bytes && !bytes->empty() && rank >= 0 && rank < INT32_MAX,
                  "tiktoken rank file {} line {}: '{}' (expected 'BASE64 rank')", path_, line_number,
                  line.substr(0, 80));
    if (seen.size() <= static_cast<size_t>(rank)) seen.resize(static_cast<size_t>(rank) + 1, false);
    SHARDLM_CHECK(!seen[rank], "tiktoken rank file {} line {}: rank {} appears twice", path_, line_number, rank);
    seen[rank] = true;
    if (token_bytes_.size() <= static_cast<size_t>(rank)) token_bytes_.resize(static_cast<size_t>(rank) + 1);
    token_bytes_[rank] = *bytes;
    SHARDLM_CHECK(rank_of_bytes_.emplace(std::move(*bytes), static_cast<int32_t>(rank)).second,
                  "tiktoken rank file {} line {}: the same bytes have two ranks", path_, line_number);
  });
  rank_count_ = token_bytes_.size();
  SHARDLM_CHECK(rank_count_ > 0 && rank_of_bytes_.size() == rank_count_,
                "tiktoken rank file {} has {} tokens but ranks up to {} (expected ranks 0..n-1)", path_,
                rank_of_bytes_.size(), static_cast<int64_t>(rank_count_) - 1);
  for (int b = 0; b < 256; ++b) {
    const auto it = rank_of_bytes_.find(std::string(1, static_cast<char>(b)));
    SHARDLM_CHECK(it != rank_of_bytes_.end(), "tiktoken rank file {} has no token for byte {} (expected all 256)",
                  path_, b);
    words_.byte_ids[b] = it->second;
  }
  // Every split of a token into two tokens is a merge whose priority is the token's
  // rank: merging the adjacent pair of lowest merged rank is tiktoken's loop.
  words_.whole_words = &rank_of_bytes_;
  words_.merges.reserve(rank_count_ * 2);
  for (size_t rank = 0; rank < rank_count_; ++rank) {
    const std::string_view bytes = token_bytes_[rank];
    for (size_t cut = 1; cut < bytes.size(); ++cut) {
      const auto left = rank_of_bytes_.find(bytes.substr(0, cut));
      if (left == rank_of_bytes_.end()) continue;
      const auto right = rank_of_bytes_.find(bytes.substr(cut));
      if (right == rank_of_bytes_.end()) continue;
      words_.merges.add(left->second, right->second, static_cast<int32_t>(rank), static_cast<int32_t>(rank));
    }
  }
}

std::string TiktokenTokenizer::spec() const { return "tiktoken:" + preset_.name + ":" + path_ + "#sha256=" + sha256_; }

std::optional<int32_t> TiktokenTokenizer::special_token_id(std::string_view text) const {
  for (const auto& [name, id] : preset_.special_tokens)
    if (name == text) return id;
  return std::nullopt;
}

std::string TiktokenTokenizer::normalize(std::string_view text) const {
  return preset_.nfc ? nfc_normalize(text) : std::string(text);
}

std::vector<int32_t> TiktokenTokenizer::encode_text(std::string_view text, SpecialTokens specials) const {
  const std::string normalized = normalize(text);
  return encode_with_special_tokens(special_tokens_, normalized, specials,
                                    [this](std::string_view piece, std::vector<int32_t>& out) {
                                      words_.encode_split(regex_, piece, out);
                                    });
}

std::string TiktokenTokenizer::decode(std::span<const int32_t> ids) const {
  return concatenate_token_bytes(ids, token_bytes_, "tiktoken tokenizer " + path_);
}

}  // namespace shardlm
