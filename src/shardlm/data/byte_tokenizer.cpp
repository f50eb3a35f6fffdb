#include "shardlm/data/byte_tokenizer.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

std::vector<int32_t> ByteTokenizer::encode_text(std::string_view text, SpecialTokens) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    SHARDLM_CHECK(ids[i] >= 0 && ids[i] < 256,
                  "byte tokenizer: cannot decode token id {} at position {} (expected 0..255)",
                  ids[i], i);
    text[i] = static_cast<char>(ids[i]);
  }
  return text;
}

}  // namespace shardlm
