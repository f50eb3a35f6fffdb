// A compiled PCRE2 pattern in UTF + UCP mode (real Unicode classes for \p{L},
// \p{N}, \s, case-insensitive groups), JIT-compiled, as the pre-tokenizers of
// GPT-2, Llama 3 and Qwen2 need. Text need not be valid UTF-8: invalid bytes are
// never part of a match.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace shardlm {

struct TextSpan {
  size_t begin;
  size_t end;
};

class Pcre2Regex {
 public:
  // Error naming `what` (e.g. "tokenizer.json pre_tokenizer Split pattern") and the
  // position when PCRE2 rejects the pattern.
  Pcre2Regex(std::string_view pattern, std::string_view what);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Appends the non-overlapping, non-empty matches in text[start..) to `matches`,
  // leftmost first, stopping after `max_matches`; returns where a further call
  // should start (text.size() when the text is exhausted). An empty match moves
  // the search on by one byte (the same next match as skipping one character, since
  // matching never starts inside a UTF-8 sequence). Thread-safe.
  size_t find_matches(std::string_view text, size_t start, std::vector<TextSpan>& matches,
                      size_t max_matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string what_;
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace shardlm
