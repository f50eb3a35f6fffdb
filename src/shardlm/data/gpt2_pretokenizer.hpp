// Regex pre-tokenization: cutting text into the words BPE merges within.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "shardlm/data/pcre2_regex.hpp"

namespace shardlm {

// Cuts text into words: the matches of `regex` and, as words of their own, the
// stretches between matches (with GPT-2's and similar patterns these are only
// bytes that are not valid UTF-8), so the words concatenate back to the text
// exactly and no byte is ever dropped. Hugging Face's Split with behaviour
// "Isolated". Appends the words of text[start..) to `words`, stopping after about
// `max_words`; returns where the next call should start (text.size() when done).
size_t split_isolated(const Pcre2Regex& regex, std::string_view text, size_t start,
                      std::vector<std::string_view>& words, size_t max_words);

namespace gpt2 {

// GPT-2's pre-tokenizer regex, with real Unicode letter/number/space categories
// under PCRE2's UTF + UCP mode.
inline constexpr std::string_view kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace gpt2
}  // namespace shardlm
