#include "shardlm/data/gpt2_tokenizer.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/data/byte_level_unicode.hpp"

namespace shardlm {
namespace {

constexpr std::string_view kEndOfTextText = "<|endoftext|>";
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCacheEntries = 1 << 18;
constexpr size_t kWordsPerBatch = 1 << 16;

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
    byte_id_[b] = it->second;
  }
  if (const auto it = id_of_bytes_.find(kEndOfTextText); it != id_of_bytes_.end()) end_of_text_ = it->second;
}

void Gpt2Tokenizer::load_merges(const std::string& path) {
  const std::string content = read_tokenizer_file(path, "GPT-2's merges.txt: one merge 'A B' per line");
  std::string_view rest = content;
  int line_number = 0;
  int32_t rank = 0;
  merges_.reserve(token_bytes_.size());
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
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
    merges_.try_emplace(pair_key(ids[0], ids[1]), Merge{rank, merged_it->second});
    ++rank;
  }
  SHARDLM_CHECK(rank > 0, "tokenizer file {} has no merges (expected GPT-2's merges.txt, one 'A B' per line)", path);
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  std::vector<std::string_view> words;
  size_t cursor = 0;
  while (cursor < text.size()) {
    words.clear();
    cursor = pre_tokenizer_.split(text, cursor, words, kWordsPerBatch);
    for (std::string_view word : words) encode_word(word, ids);
  }
  return ids;
}

void Gpt2Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (word.size() > kMaxCachedWordBytes) {
    apply_merges(word, out);
    return;
  }
  {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  apply_merges(word, out);
  std::vector<int32_t> word_ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.try_emplace(std::string(word), std::move(word_ids));
}

// Merges the lowest-ranked adjacent pair first, leftmost first among equal
// ranks, until no adjacent pair has a merge: the same order as encoder.py's
// "merge every occurrence of the best bigram" loop, in O(n log n) through a
// heap of candidate pairs over a linked list of symbols.
void Gpt2Tokenizer::apply_merges(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // index of the left symbol; merged symbols keep the left index
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  const int32_t n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = {byte_id_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    candidates.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!candidates.empty()) {
    const Candidate best = candidates.top();
    candidates.pop();
    Symbol& left = symbols[best.left];
    // Skip stale candidates: a symbol only ever grows, so an unchanged id means
    // the pair is still there.
    if (left.id != best.left_id || left.next < 0 || symbols[left.next].id != best.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = best.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = best.left;
    right.id = -1;
    consider(left.prev);
    consider(best.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  size_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    SHARDLM_CHECK(ids[i] >= 0 && ids[i] < vocab_size(),
                  "GPT-2 tokenizer: cannot decode token id {} at position {} (expected 0..{})", ids[i], i,
                  vocab_size() - 1);
    bytes += token_bytes_[ids[i]].size();
  }
  text.reserve(bytes);
  for (int32_t id : ids) text += token_bytes_[id];
  return text;
}

}  // namespace shardlm
