#include "shardlm/data/byte_level_unicode.hpp"

#include <array>

#include "shardlm/data/utf8.hpp"

namespace shardlm::gpt2 {
namespace {

// Printable bytes keep their own code point; the other 68 bytes are numbered
// from U+0100 upwards in byte order (exactly bytes_to_unicode() of GPT-2).
struct ByteTable {
  std::array<char32_t, 256> code_point_of_byte{};
  std::array<int16_t, 512> byte_of_code_point{};  // -1: not in the table

  ByteTable() {
    byte_of_code_point.fill(-1);
    auto keeps_own_code_point = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = keeps_own_code_point(b) ? static_cast<char32_t>(b) : next_extra++;
      code_point_of_byte[b] = cp;
      byte_of_code_point[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& table() {
  static const ByteTable instance;
  return instance;
}

}  // namespace

char32_t byte_to_code_point(uint8_t byte) { return table().code_point_of_byte[byte]; }

std::string bytes_to_token_text(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (char b : bytes) utf8::append(text, table().code_point_of_byte[static_cast<uint8_t>(b)]);
  return text;
}

std::optional<std::string> token_text_to_bytes(std::string_view token_text) {
  std::string bytes;
  bytes.reserve(token_text.size());
  size_t pos = 0;
  while (pos < token_text.size()) {
    const std::optional<char32_t> cp = utf8::decode(token_text, pos);
    if (!cp || *cp >= table().byte_of_code_point.size()) return std::nullopt;
    const int16_t byte = table().byte_of_code_point[*cp];
    if (byte < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte));
  }
  return bytes;
}

}  // namespace shardlm::gpt2
