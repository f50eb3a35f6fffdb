// GPT-2's reversible byte <-> code point table. vocab.json and merges.txt spell
// each byte of a token as one printable code point (space is 'Ġ' U+0120,
// newline 'Ċ' U+010A), so token bytes must be recovered through this table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardlm::gpt2 {

// The code point GPT-2 uses to spell `byte` (bytes_to_unicode() in encoder.py).
char32_t byte_to_code_point(uint8_t byte);

// The text vocab.json / merges.txt / tokenizer.json use for a token's bytes.
std::string bytes_to_token_text(std::string_view bytes);

// Decodes a token as written in vocab.json / merges.txt (UTF-8 text of mapped
// code points) into the raw bytes it stands for. nullopt when the text is not
// valid UTF-8 or holds a code point outside the table.
std::optional<std::string> token_text_to_bytes(std::string_view token_text);

}  // namespace shardlm::gpt2
