// Tokens -> the template's statement tree, with Jinja's expression grammar
// (lowest binding first: conditional "x if c else y", or, and, not,
// comparisons and in, + -, ~, * / // %, **, unary - +, then postfix
// attribute/subscript/call, filters "|" and tests "is").
#pragma once

#include <vector>

#include "shardlm/data/jinja/ast.hpp"
#include "shardlm/data/jinja/lexer.hpp"

namespace shardlm::jinja {

// Error "chat template line N: ..." for a syntax error, an unclosed block, or a
// statement this interpreter does not implement (include, extends, import,
// block, raw, with, ...), naming it.
Body parse(const std::vector<Token>& tokens);

}  // namespace shardlm::jinja
