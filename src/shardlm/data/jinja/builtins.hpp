// Jinja's filters and tests and the Python methods chat templates call on
// strings and dicts, as far as Hugging Face chat templates use them. Anything
// else is an Error naming it ("chat template line N: filter 'x' is not supported").
#pragma once

#include <string>

#include "shardlm/data/jinja/value.hpp"

namespace shardlm::jinja {

// value | name(args)
Value apply_filter(const std::string& name, const Value& value, const CallArgs& args, int line);
// value is name(args)
bool apply_test(const std::string& name, const Value& value, const CallArgs& args, int line);
// value.name, when it names a method of value's type (str.split, dict.items, ...):
// the method bound to value. Undefined when it names none.
Value bound_method(const Value& value, const std::string& name, int line);

// Python's str.strip(chars) family on UTF-8 text (chars: nullopt = Unicode
// white space). which: 'b' both ends, 'l' left, 'r' right.
std::string python_strip(const std::string& text, const std::optional<std::string>& chars, char which);
bool is_python_space(char32_t cp);

[[noreturn]] void fail(int line, const std::string& what);

}  // namespace shardlm::jinja
