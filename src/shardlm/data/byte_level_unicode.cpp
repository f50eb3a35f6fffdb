#include "shardlm/data/byte_level_unicode.hpp"

#include <array>

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

// Strict UTF-8 decoding of one code point at text[pos]; advances pos. Returns
// nullopt for malformed, overlong or surrogate sequences.
std::optional<char32_t> next_code_point(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  int length = 0;
  char32_t cp = 0;
  if (lead < 0x80) {
    ++pos;
    return lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    cp = lead & 0x07;
  } else {
    return std::nullopt;
  }
  if (pos + length > text.size()) return std::nullopt;
  for (int i = 1; i < length; ++i) {
    const unsigned char c = byte(pos + i);
    if ((c & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (c & 0x3F);
  }
  static constexpr char32_t kMinimum[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinimum[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
  pos += length;
  return cp;
}

}  // namespace

char32_t byte_to_code_point(uint8_t byte) { return table().code_point_of_byte[byte]; }

std::optional<std::string> token_text_to_bytes(std::string_view token_text) {
  std::string bytes;
  bytes.reserve(token_text.size());
  size_t pos = 0;
  while (pos < token_text.size()) {
    const std::optional<char32_t> cp = next_code_point(token_text, pos);
    if (!cp || *cp >= table().byte_of_code_point.size()) return std::nullopt;
    const int16_t byte = table().byte_of_code_point[*cp];
    if (byte < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte));
  }
  return bytes;
}

}  // namespace shardlm::gpt2
