#include "shardlm/data/gpt2_pretokenizer.hpp"

#include <algorithm>

namespace shardlm {

size_t split_isolated(const Pcre2Regex& regex, std::string_view text, size_t start,
                      std::vector<std::string_view>& words, size_t max_words) {
  std::vector<TextSpan> matches;
  matches.reserve(std::min<size_t>(max_words, 1 << 16));
  const size_t next = regex.find_matches(text, start, matches, max_words);
  size_t cursor = start;
  for (const TextSpan& m : matches) {
    if (m.begin > cursor) words.push_back(text.substr(cursor, m.begin - cursor));
    words.push_back(text.substr(m.begin, m.end - m.begin));
    cursor = m.end;
  }
  // When the text is exhausted, whatever follows the last match is a word too.
  if (next == text.size() && cursor < text.size()) {
    words.push_back(text.substr(cursor));
    cursor = text.size();
  }
  return cursor;
}

}  // namespace shardlm
