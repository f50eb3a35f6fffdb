// Walking the lines of a text file held in memory (merges.txt, tiktoken rank
// files, JSONL datasets).
#pragma once

#include <string_view>

namespace shardlm {

// Calls on_line(line_number, line) for each line of `text`, numbered from 1,
// without its "\n" or "\r\n"; a last line without a newline counts too.
template <typename OnLine>
void for_each_line(std::string_view text, OnLine&& on_line) {
  int line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    on_line(++line_number, line);
  }
}

}  // namespace shardlm
