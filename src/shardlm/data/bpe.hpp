// The byte-pair encoding shared by the byte-level BPE tokenizers (GPT-2's
// vocab.json + merges.txt, Hugging Face tokenizer.json BPE models, tiktoken rank
// files): a word starts as one symbol per byte and adjacent pairs are merged,
// lowest priority first (leftmost among equal priorities), until no adjacent
// pair has a merge. With priority = merge-list rank this is OpenAI's encoder.py
// and Hugging Face's BPE; with priority = rank of the merged token it is
// tiktoken's byte_pair_merge.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardlm {

class Pcre2Regex;

// Hash for maps keyed by std::string that are looked up with string_view.
struct TransparentStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using IdOfBytes = std::unordered_map<std::string, int32_t, TransparentStringHash, std::equal_to<>>;

class BpeMerges {
 public:
  void reserve(size_t merges) { merges_.reserve(merges); }
  // Adds the merge (left, right) -> merged. For a pair added twice, encoder.py
  // keeps the first and Hugging Face's BPE the last. Returns whether it was new.
  enum class Duplicate { first_wins, last_wins };
  bool add(int32_t left, int32_t right, int32_t priority, int32_t merged, Duplicate duplicate = Duplicate::first_wins);
  size_t size() const { return merges_.size(); }

  // Appends the merged ids of `word` (non-empty), whose byte b starts as the
  // symbol byte_ids[b].
  void apply(std::string_view word, const std::array<int32_t, 256>& byte_ids, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t priority;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  std::unordered_map<uint64_t, Merge> merges_;
};

// The ids of words: the whole word's id when `whole_words` is set and holds it
// (tiktoken; Hugging Face's ignore_merges), else the merges over its bytes.
// Short words are remembered (words repeat a lot in text; bounded, cleared when
// full). Thread-safe once filled.
class BpeWordEncoder {
 public:
  BpeMerges merges;
  std::array<int32_t, 256> byte_ids{};
  const IdOfBytes* whole_words = nullptr;

  // Appends the ids of `word` (empty: nothing).
  void encode(std::string_view word, std::vector<int32_t>& ids) const;
  // Cuts `text` into words with split_isolated(regex) and appends their ids.
  void encode_split(const Pcre2Regex& regex, std::string_view text, std::vector<int32_t>& ids) const;

 private:
  static constexpr size_t kMaxCachedWordBytes = 64;
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, TransparentStringHash, std::equal_to<>> cache_;
};

// The concatenated bytes of `ids`; an id outside token_bytes or with empty bytes
// (no such token) is an Error naming `tokenizer` and the position.
std::string concatenate_token_bytes(std::span<const int32_t> ids, const std::vector<std::string>& token_bytes,
                                    std::string_view tokenizer);

}  // namespace shardlm
