#include "shardlm/data/bpe.hpp"

#include <queue>

#include "shardlm/core/error.hpp"
#include "shardlm/data/gpt2_pretokenizer.hpp"

namespace shardlm {

bool BpeMerges::add(int32_t left, int32_t right, int32_t priority, int32_t merged, Duplicate duplicate) {
  const auto [it, added] = merges_.try_emplace(pair_key(left, right), Merge{priority, merged});
  if (!added && duplicate == Duplicate::last_wins) it->second = Merge{priority, merged};
  return added;
}

// A heap of candidate pairs over a linked list of symbols: O(n log n) per word.
void BpeMerges::apply(std::string_view word, const std::array<int32_t, 256>& byte_ids,
                      std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t priority;
    int32_t left;  // index of the left symbol; merged symbols keep the left index
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return priority != other.priority ? priority > other.priority : left > other.left;
    }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = {byte_ids[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    candidates.push({it->second.priority, left, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!candidates.empty()) {
    const Candidate best = candidates.top();
    candidates.pop();
    Symbol& left = symbols[best.left];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or the last symbol
    Symbol& right = symbols[left.next];
    // A candidate is stale unless the pair now at its place still merges into the
    // same token (Hugging Face's rule; the pair itself may differ when several
    // pairs merge into one token, as in merges derived from tiktoken ranks).
    const auto now = merges_.find(pair_key(left.id, right.id));
    if (now == merges_.end() || now->second.merged_id != best.merged_id) continue;
    left.id = best.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = best.left;
    right.id = -1;
    consider(left.prev);
    consider(best.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

void BpeWordEncoder::encode(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    ids.push_back(byte_ids[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (whole_words != nullptr) {
    if (const auto it = whole_words->find(word); it != whole_words->end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    merges.apply(word, byte_ids, ids);
    return;
  }
  {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  merges.apply(word, byte_ids, ids);
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.try_emplace(std::string(word), ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end());
}

void BpeWordEncoder::encode_split(const Pcre2Regex& regex, std::string_view text, std::vector<int32_t>& ids) const {
  constexpr size_t kWordsPerBatch = 1 << 16;
  std::vector<std::string_view> words;
  size_t cursor = 0;
  while (cursor < text.size()) {
    words.clear();
    cursor = split_isolated(regex, text, cursor, words, kWordsPerBatch);
    for (std::string_view word : words) encode(word, ids);
  }
}

std::string concatenate_token_bytes(std::span<const int32_t> ids, const std::vector<std::string>& token_bytes,
                                    std::string_view tokenizer) {
  size_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    SHARDLM_CHECK(ids[i] >= 0 && static_cast<size_t>(ids[i]) < token_bytes.size() && !token_bytes[ids[i]].empty(),
                  "{}: cannot decode token id {} at position {} (no such token; vocabulary 0..{})", tokenizer, ids[i],
                  i, static_cast<int64_t>(token_bytes.size()) - 1);
    bytes += token_bytes[ids[i]].size();
  }
  std::string text;
  text.reserve(bytes);
  for (int32_t id : ids) text += token_bytes[id];
  return text;
}

}  // namespace shardlm
