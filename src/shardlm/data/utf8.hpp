// Strict UTF-8 decoding and encoding of single code points.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace shardlm::utf8 {

// Decodes the code point at text[pos] and advances pos past it. nullopt (pos
// unchanged) for a malformed, truncated, overlong or surrogate sequence.
std::optional<char32_t> decode(std::string_view text, size_t& pos);

// Where text stops being valid UTF-8: the byte offset of the first malformed sequence
// and how many there are (each skips one byte); nullopt when all of it is valid.
struct InvalidUtf8 {
  size_t first_offset = 0;
  size_t count = 0;
};
std::optional<InvalidUtf8> find_invalid(std::string_view text);

// Appends the UTF-8 encoding of cp (a scalar value: <= U+10FFFF, not a surrogate).
void append(std::string& out, char32_t cp);

}  // namespace shardlm::utf8
