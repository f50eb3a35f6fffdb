// The byte tokenizer: 256 ids, id == byte value, no end-of-text token.
#pragma once

#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return 256; }
  std::string spec() const override { return "byte"; }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
  std::optional<int32_t> special_token_id(std::string_view) const override { return std::nullopt; }

 protected:
  std::vector<int32_t> encode_text(std::string_view text, SpecialTokens specials) const override;
};

}  // namespace shardlm
