// A Jinja template as Hugging Face chat templates use the language, parsed
// once and rendered against variables. Implemented: {{ }}, {% %}, {# #},
// whitespace control (trim_blocks and lstrip_blocks on, as transformers
// renders), if/elif/else, for (loop.*, else, "if" filter, break/continue),
// set (tuples, namespace attributes, block set), macro and call, filter
// blocks, {% generation %} (rendered as its body); expressions with literals,
// lists, dicts, attributes, subscripts and slices, in / not in, is-tests,
// and/or/not, comparisons, arithmetic, ~, and conditional expressions; the
// filters, tests and methods of builtins.hpp; the globals namespace(), range(),
// dict() and raise_exception(msg). The caller supplies every other variable
// (messages, bos_token, strftime_now, ...). Scoping is Jinja's: a for body's
// assignments stay in it, an if's do not.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardlm/data/jinja/ast.hpp"
#include "shardlm/data/jinja/lexer.hpp"
#include "shardlm/data/jinja/value.hpp"

namespace shardlm::jinja {

using Variables = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  // Error "chat template line N: ..." for a syntax error or a construct that
  // is not implemented, naming it.
  explicit Template(std::string_view source, const LexerOptions& options = {});
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

  // Error "chat template line N: ..." for a failed render (raise_exception's
  // message, an undefined value used as a container, a type error, an
  // unsupported filter/test/method).
  std::string render(const Variables& variables) const;

 private:
  Body body_;
};

// strftime_now(format) as transformers defines it, but at a fixed time
// (seconds since the epoch, formatted in UTC) so renders are reproducible.
Value strftime_now_at(int64_t unix_seconds);

}  // namespace shardlm::jinja
