#include "shardlm/data/gpt2_tokenizer.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/data/byte_level_unicode.hpp"
#include "shardlm/data/text_lines.hpp"

namespace shardlm {
namespace {

constexpr std::string_view kEndOfTextText = "<|endoftext|>";

std::string read_tokenizer_file(const std::string& path, std::string_view expected) {
  std::ifstream in(path, std::ios::binary);
  SHARDLM_CHECK(in.good(), "cannot read tokenizer file {}: {} (expected {})", path,
                std::strerror(errno), expected);
  std::ostringstream content;
  content << in.rdbuf();
  SHARDLM_CHECK(!in.bad(), "cannot read tokenizer file {}: read error (expected {})", path, expected);
  return content.str();
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir)
    : dir_(std::filesystem::absolute(dir).lexically_normal().string()) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  load_vocab(dir_ + "/vocab.json");
  load_merges(dir_ + "/merges.txt");
}

void Gpt2Tokenizer::load_vocab(const std::string& path) {
  constexpr std::string_view kExpected = "GPT-2's vocab.json: a JSON object mapping token text to id";
  const std::string content = read_tokenizer_file(path, kExpected);
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(content);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("tokenizer file {} is not valid JSON at byte {} (expected {})", path,
                            e.byte, kExpected));
  }
  SHARDLM_CHECK(vocab.is_object() && !vocab.empty(), "tokenizer file {} is {} (expected {})", path,
                vocab.is_object() ? "an empty object" : vocab.type_name(), kExpected);
  const size_t size = vocab.size();
  SHARDLM_CHECK(size <= static_cast<size_t>(INT32_MAX), "tokenizer file {} has {} tokens (expected at most {})",
                path, size, INT32_MAX);
  token_bytes_.assign(size, std::string());
  std::vector<bool> seen(size, false);
  for (const auto& [text, value] : vocab.items()) {
    SHARDLM_CHECK(value.is_number_integer(), "tokenizer file {}: token \"{}\" maps to {} (expected an integer id)",
                  path, text, value.dump());
    const int64_t id = value.get<int64_t>();
    SHARDLM_CHECK(id >= 0 && static_cast<size_t>(id) < size,
                  "tokenizer file {}: token \"{}\" has id {} (expected ids 0..{}, one per token)", path, text,
                  id, size - 1);
    SHARDLM_CHECK(!seen[id], "tokenizer file {}: id {} is used twice (expected each id once)", path, id);
    seen[id] = true;
    std::optional<std::string> bytes = gpt2::token_text_to_bytes(text);
    SHARDLM_CHECK(bytes.has_value() && !bytes->empty(),
                  "tokenizer file {}: token \"{}\" (id {}) is not spelled in GPT-2's byte-to-unicode alphabet",
                  path, text, id);
    token_bytes_[id] = std::move(*bytes);
    id_of_bytes_.emplace(token_bytes_[id], static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_bytes_.find(std::string(1, static_cast<char>(b)));
    SHARDLM_CHECK(it != id_of_bytes_.end(),
                  "tokenizer file {} has no token for byte {} (expected all 256 single-byte tokens)", path, b);
    words_.byte_ids[b] = it->second;
  }
  if (const auto it = id_of_bytes_.find(kEndOfTextText); it != id_of_bytes_.end()) {
    end_of_text_ = it->second;
    special_tokens_.add(std::string(kEndOfTextText), it->second);
  }
}

void Gpt2Tokenizer::load_merges(const std::string& path) {
  const std::string content = read_tokenizer_file(path, "GPT-2's merges.txt: one merge 'A B' per line");
  int32_t rank = 0;
  words_.merges.reserve(token_bytes_.size());
  for_each_line(content, [&](int line_number, std::string_view line) {
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) return;
    const size_t space = line.find(' ');
    SHARDLM_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                      line.find(' ', space + 1) == std::string_view::npos,
                  "tokenizer file {} line {}: '{}' (expected two tokens separated by one space)", path,
                  line_number, line);
    const std::string_view parts[2] = {line.substr(0, space), line.substr(space + 1)};
    int32_t ids[2];
    std::string merged;
    for (int i = 0; i < 2; ++i) {
      const std::optional<std::string> bytes = gpt2::token_text_to_bytes(parts[i]);
      SHARDLM_CHECK(bytes.has_value(),
                    "tokenizer file {} line {}: '{}' is not spelled in GPT-2's byte-to-unicode alphabet", path,
                    line_number, parts[i]);
      const auto it = id_of_bytes_.find(*bytes);
      SHARDLM_CHECK(it != id_of_bytes_.end(),
                    "tokenizer file {} line {}: token '{}' is not in vocab.json (expected merges of vocabulary tokens)",
                    path, line_number, parts[i]);
      ids[i] = it->second;
      merged += *bytes;
    }
    const auto merged_it = id_of_bytes_.find(merged);
    SHARDLM_CHECK(merged_it != id_of_bytes_.end(),
                  "tokenizer file {} line {}: the merge of '{}' and '{}' is not in vocab.json", path,
                  line_number, parts[0], parts[1]);
    words_.merges.add(ids[0], ids[1], rank, merged_it->second);
    ++rank;
  });
  SHARDLM_CHECK(rank > 0, "tokenizer file {} has no merges (expected GPT-2's merges.txt, one 'A B' per line)", path);
}

std::optional<int32_t> Gpt2Tokenizer::special_token_id(std::string_view text) const {
  return text == kEndOfTextText ? end_of_text_ : std::nullopt;
}

std::vector<int32_t> Gpt2Tokenizer::encode_text(std::string_view text, SpecialTokens specials) const {
  return encode_with_special_tokens(special_tokens_, text, specials,
                                    [this](std::string_view piece, std::vector<int32_t>& out) {
                                      words_.encode_split(regex_, piece, out);
                                    });
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  return concatenate_token_bytes(ids, token_bytes_, "GPT-2 tokenizer");
}

}  // namespace shardlm
