#include "shardlm/data/added_tokens.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"

namespace shardlm {

void AddedTokenMatcher::add(std::string text, int32_t id) {
  SHARDLM_ASSERT(!text.empty());
  for (const Token& token : tokens_)
    if (token.text == text) return;
  auto& bucket = by_first_byte_[static_cast<unsigned char>(text[0])];
  tokens_.push_back({std::move(text), id});
  bucket.push_back(static_cast<uint32_t>(tokens_.size() - 1));
  std::stable_sort(bucket.begin(), bucket.end(),
                   [&](uint32_t a, uint32_t b) { return tokens_[a].text.size() > tokens_[b].text.size(); });
}

void AddedTokenMatcher::find_all(std::string_view text, std::vector<AddedTokenMatch>& out) const {
  if (tokens_.empty()) return;
  for (size_t pos = 0; pos < text.size();) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[pos])];
    const Token* found = nullptr;
    for (uint32_t index : bucket) {
      if (text.substr(pos).starts_with(tokens_[index].text)) {
        found = &tokens_[index];
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    out.push_back({pos, pos + found->text.size(), found->id});
    pos += found->text.size();
  }
}

}  // namespace shardlm
