// The byte tokenizer: 256 ids, id == byte value, no end-of-text token.
#pragma once

#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return 256; }
  std::string spec() const override { return "byte"; }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
};

}  // namespace shardlm
