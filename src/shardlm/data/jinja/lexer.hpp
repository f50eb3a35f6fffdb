// Template source -> tokens, with Jinja's whitespace control applied to the
// text between tags: "{%-"/"{{-"/"{#-" strip the white space before a tag,
// "-%}"/"-}}"/"-#}" the white space after it; trim_blocks removes the first
// newline after a block or comment tag, lstrip_blocks the spaces and tabs
// before one on its line ("{%+" and "+%}" turn those two off for a tag).
// transformers renders chat templates with trim_blocks=True, lstrip_blocks=True.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardlm::jinja {

struct Token {
  enum class Kind {
    text,           // literal template text (value)
    variable_begin, // {{
    variable_end,   // }}
    block_begin,    // {%
    block_end,      // %}
    name,           // identifier or keyword (value)
    string,         // string literal, escapes decoded (value)
    integer,        // value: the digits
    floating,       // value: the literal
    op,             // operator or punctuation (value)
    end,            // end of the template
  };
  Kind kind;
  std::string value;
  int line = 1;  // 1-based line of the template where the token starts
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Error "chat template line N: ..." for an unterminated tag, comment or string,
// or a character no expression can hold.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options);

}  // namespace shardlm::jinja
