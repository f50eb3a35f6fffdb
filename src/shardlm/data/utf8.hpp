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

// Appends the UTF-8 encoding of cp (a scalar value: <= U+10FFFF, not a surrogate).
void append(std::string& out, char32_t cp);

}  // namespace shardlm::utf8
