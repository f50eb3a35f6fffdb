// Finding added/special tokens (such as "<|im_end|>") inside text before it is
// pre-tokenized, as Hugging Face tokenizers and tiktoken do: leftmost match first,
// the longest token among those starting there.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

struct AddedTokenMatch {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // `text` must be non-empty; adding the same text twice keeps the first id.
  void add(std::string text, int32_t id);
  bool empty() const { return tokens_.empty(); }

  // Appends the non-overlapping matches in `text`, left to right.
  void find_all(std::string_view text, std::vector<AddedTokenMatch>& out) const;

 private:
  struct Token {
    std::string text;
    int32_t id;
  };
  std::vector<Token> tokens_;
  // Indices into tokens_ by first byte, longest first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace shardlm

namespace shardlm {

// Appends the ids of `text` to `ids`: each match of `matcher` becomes its id and
// every stretch between matches is handed to encode_piece(piece, ids).
template <typename EncodePiece>
void encode_around_added_tokens(const AddedTokenMatcher& matcher, std::string_view text, std::vector<int32_t>& ids,
                                EncodePiece&& encode_piece) {
  std::vector<AddedTokenMatch> matches;
  matcher.find_all(text, matches);
  size_t cursor = 0;
  for (const AddedTokenMatch& match : matches) {
    if (match.begin > cursor) encode_piece(text.substr(cursor, match.begin - cursor), ids);
    ids.push_back(match.id);
    cursor = match.end;
  }
  if (cursor < text.size()) encode_piece(text.substr(cursor), ids);
}

// The ids of `text` for a tokenizer whose special tokens are `specials_matcher`:
// encode_ordinary(piece, ids) for all of it, or around the special tokens when
// they are recognized.
template <typename EncodeOrdinary>
std::vector<int32_t> encode_with_special_tokens(const AddedTokenMatcher& specials_matcher, std::string_view text,
                                                SpecialTokens specials, EncodeOrdinary&& encode_ordinary) {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  if (specials == SpecialTokens::recognized)
    encode_around_added_tokens(specials_matcher, text, ids, encode_ordinary);
  else
    encode_ordinary(text, ids);
  return ids;
}

}  // namespace shardlm
