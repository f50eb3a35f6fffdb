// GPT-2's pre-tokenizer: the regex that cuts text into words before BPE,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with real Unicode letter/number/space categories (PCRE2 in UTF + UCP mode,
// JIT-compiled).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace shardlm::gpt2 {

class PreTokenizer {
 public:
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text` that start at byte `start` or later to `words`,
  // in order, stopping after `max_words`; returns where the next call should
  // start (text.size() when done). The words concatenate back to the text
  // exactly: bytes that are not valid UTF-8 (which the regex never matches)
  // become words of their own, so no byte is ever dropped. Thread-safe.
  size_t split(std::string_view text, size_t start, std::vector<std::string_view>& words,
               size_t max_words) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace shardlm::gpt2
