#include "shardlm/data/jinja/builtins.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "shardlm/core/error.hpp"
#include "shardlm/data/utf8.hpp"

namespace shardlm::jinja {

void fail(int line, const std::string& what) { throw Error(fmt::format("chat template line {}: {}", line, what)); }

bool is_python_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

namespace {

bool is_space_piece(const std::string& piece) {
  size_t pos = 0;
  const std::optional<char32_t> cp = utf8::decode(piece, pos);
  return cp && is_python_space(*cp);
}

std::string join(const std::vector<std::string>& pieces, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) out += pieces[i];
  return out;
}

// The argument at `index` or keyword `key`, if given.
const Value* argument(const CallArgs& args, size_t index, const char* key) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keywords)
    if (k == key) return &v;
  return nullptr;
}

void check_arity(const CallArgs& args, size_t most, const std::string& what, int line) {
  if (args.positional.size() + args.keywords.size() > most)
    fail(line, fmt::format("{} takes at most {} argument(s), {} given", what, most,
                           args.positional.size() + args.keywords.size()));
}

const std::string& need_string(const Value& v, const std::string& what, int line) {
  if (!v.is_string()) fail(line, fmt::format("{} needs a string, got {} {}", what, v.type_name(), v.repr()));
  return v.as_string();
}

int64_t need_int(const Value& v, const std::string& what, int line) {
  if (v.kind() != Value::Kind::integer && v.kind() != Value::Kind::boolean)
    fail(line, fmt::format("{} needs an integer, got {} {}", what, v.type_name(), v.repr()));
  return v.as_int();
}

std::optional<std::string> optional_chars(const CallArgs& args, const std::string& what, int line) {
  const Value* chars = argument(args, 0, "chars");
  if (!chars || chars->is_none()) return std::nullopt;
  return need_string(*chars, what, line);
}

// The items a for loop, list() or a filter walks over.
Array iterate(const Value& v, const std::string& what, int line) {
  switch (v.kind()) {
    case Value::Kind::undefined: return {};
    case Value::Kind::array: return v.as_array();
    case Value::Kind::string: {
      Array out;
      for (std::string& piece : code_points(v.as_string())) out.emplace_back(std::move(piece));
      return out;
    }
    case Value::Kind::object: {
      if (v.as_object()->is_namespace) break;
      Array out;
      for (const auto& [key, _] : v.as_object()->entries) out.emplace_back(key);
      return out;
    }
    default: break;
  }
  fail(line, fmt::format("{}: a {} is not iterable", what, v.type_name()));
}

std::string ascii_case(const std::string& text, bool upper, const std::string& what, int line) {
  std::string out = text;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) >= 0x80)
      fail(line, fmt::format("{} of non-ASCII text is not supported (text {})", what, Value(text).repr()));
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string title_case(const std::string& text, bool only_first, const std::string& what, int line) {
  std::string out = ascii_case(text, false, what, line);
  bool start = true;
  for (char& c : out) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (letter && start && c >= 'a') c = static_cast<char>(c - 'a' + 'A');
    if (!only_first) start = !letter;
    else start = false;
  }
  return out;
}

Array split_string(const std::string& text, const Value* sep, const Value* maxsplit_value, bool from_right,
                   int line) {
  int64_t maxsplit = maxsplit_value ? need_int(*maxsplit_value, "split's maxsplit", line) : -1;
  std::vector<std::string> pieces;
  if (!sep || sep->is_none()) {
    // Runs of white space, none at the ends.
    const std::vector<std::string> cps = code_points(text);
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < cps.size();) {
      while (i < cps.size() && is_space_piece(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !is_space_piece(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit) {
      if (from_right) {
        // The rest keeps its white space on the side away from the splits, as Python does.
        const size_t keep = words.size() - static_cast<size_t>(maxsplit);
        pieces.push_back(join(cps, 0, words[keep - 1].second));
        for (size_t w = keep; w < words.size(); ++w) pieces.push_back(join(cps, words[w].first, words[w].second));
      } else {
        for (size_t w = 0; w < static_cast<size_t>(maxsplit); ++w)
          pieces.push_back(join(cps, words[w].first, words[w].second));
        pieces.push_back(join(cps, words[static_cast<size_t>(maxsplit)].first, cps.size()));
      }
    } else {
      for (const auto& [b, e] : words) pieces.push_back(join(cps, b, e));
    }
  } else {
    const std::string& separator = need_string(*sep, "split", line);
    if (separator.empty()) fail(line, "split: empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(pieces.size()) < maxsplit) {
        const size_t at = text.find(separator, pos);
        if (at == std::string::npos) break;
        pieces.push_back(text.substr(pos, at - pos));
        pos = at + separator.size();
      }
      pieces.push_back(text.substr(pos));
    } else {
      size_t end = text.size();
      std::vector<std::string> reversed;
      while (maxsplit < 0 || static_cast<int64_t>(reversed.size()) < maxsplit) {
        if (end < separator.size()) break;
        const size_t at = text.rfind(separator, end - separator.size());
        if (at == std::string::npos) break;
        reversed.push_back(text.substr(at + separator.size(), end - at - separator.size()));
        end = at;
      }
      reversed.push_back(text.substr(0, end));
      pieces.assign(reversed.rbegin(), reversed.rend());
    }
  }
  Array out;
  for (std::string& p : pieces) out.emplace_back(std::move(p));
  return out;
}

std::string replace_all(const std::string& text, const std::string& old, const std::string& now, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `now` between code points (and at both ends).
    const std::vector<std::string> cps = code_points(text);
    int64_t done = 0;
    for (const std::string& cp : cps) {
      if (count < 0 || done < count) {
        out += now;
        ++done;
      }
      out += cp;
    }
    if (count < 0 || done < count) out += now;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = text.find(old, pos);
    if (at == std::string::npos) break;
    out += text.substr(pos, at - pos);
    out += now;
    pos = at + old.size();
    ++done;
  }
  return out + text.substr(pos);
}

int64_t count_occurrences(const std::string& text, const std::string& needle) {
  if (needle.empty()) return static_cast<int64_t>(code_points(text).size()) + 1;
  int64_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + needle.size())) ++n;
  return n;
}

// The code-point index of byte offset `at` in text.
int64_t code_point_index(const std::string& text, size_t at) {
  return static_cast<int64_t>(code_points(text.substr(0, at)).size());
}

Value length_of(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::undefined: return Value(int64_t{0});
    case Value::Kind::string: return Value(static_cast<int64_t>(code_points(v.as_string()).size()));
    case Value::Kind::array: return Value(static_cast<int64_t>(v.as_array().size()));
    case Value::Kind::object:
      if (!v.as_object()->is_namespace) return Value(static_cast<int64_t>(v.as_object()->entries.size()));
      break;
    default: break;
  }
  fail(line, fmt::format("length: a {} has no length", v.type_name()));
}

Array dict_items(const Value& v) {
  Array out;
  for (const auto& [key, value] : v.as_object()->entries) out.push_back(Value::tuple(Array{Value(key), value}));
  return out;
}

// item.attribute for map/selectattr/sort/join/sum's attribute= (dotted paths, integer parts index).
Value attribute_of(const Value& item, const std::string& path, int line) {
  Value current = item;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (current.is_object()) {
      const Value* found = current.as_object()->find(part);
      current = found ? *found : Value();
    } else if (current.is_array() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      const size_t index = std::stoul(part);
      current = index < current.as_array().size() ? current.as_array()[index] : Value();
    } else if (current.is_undefined()) {
      fail(line, fmt::format("attribute '{}' of an undefined value", part));
    } else {
      current = Value();
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return current;
}

CallArgs rest_args(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keywords = args.keywords;
  return rest;
}

Value select_items(const Value& value, const CallArgs& args, bool by_attribute, bool keep_matching, int line) {
  const std::string what = by_attribute ? (keep_matching ? "selectattr" : "rejectattr") : (keep_matching ? "select" : "reject");
  const Array items = iterate(value, what, line);
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) fail(line, what + " needs an attribute name");
    attribute = need_string(args.positional[0], what, line);
    next = 1;
  }
  std::string test;
  if (args.positional.size() > next) test = need_string(args.positional[next], what, line);
  const CallArgs test_args = rest_args(args, next + 1);
  Array out;
  for (const Value& item : items) {
    const Value subject = by_attribute ? attribute_of(item, attribute, line) : item;
    const bool passes = test.empty() ? subject.truthy() : apply_test(test, subject, test_args, line);
    if (passes == keep_matching) out.push_back(item);
  }
  return Value(std::move(out));
}

Value sort_items(const Value& value, const CallArgs& args, int line) {
  Array items = iterate(value, "sort", line);
  const Value* reverse = argument(args, 0, "reverse");
  const Value* case_sensitive = argument(args, 1, "case_sensitive");
  const Value* attribute = argument(args, 2, "attribute");
  if (case_sensitive && case_sensitive->truthy()) {
  } else {
    for (const Value& item : items)
      if (item.is_string())
        for (unsigned char c : item.as_string())
          if (c >= 0x80 || (c >= 'A' && c <= 'Z'))
            fail(line, "sort: case-insensitive sorting of text with capitals or non-ASCII is not supported (pass case_sensitive=true)");
  }
  auto key = [&](const Value& v) { return attribute ? attribute_of(v, need_string(*attribute, "sort", line), line) : v; };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const std::optional<bool> lt = less(key(a), key(b));
    if (!lt) fail(line, fmt::format("sort: cannot order {} and {}", key(a).type_name(), key(b).type_name()));
    return *lt;
  });
  if (reverse && reverse->truthy()) std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value indent_text(const Value& value, const CallArgs& args, int line) {
  const std::string& text = need_string(value, "indent", line);
  const Value* width_value = argument(args, 0, "width");
  std::string pad = "    ";
  if (width_value) pad = width_value->is_string() ? width_value->as_string() : std::string(static_cast<size_t>(need_int(*width_value, "indent", line)), ' ');
  const Value* first = argument(args, 1, "first");
  const Value* blank = argument(args, 2, "blank");
  std::string out;
  size_t pos = 0;
  bool first_line = true;
  while (pos <= text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line_text = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    const bool indent_it = first_line ? (first && first->truthy()) : (!line_text.empty() || (blank && blank->truthy()));
    if (indent_it) out += pad;
    out += line_text;
    if (nl == std::string::npos) break;
    out += '\n';
    pos = nl + 1;
    first_line = false;
  }
  return Value(std::move(out));
}

Value string_method(const Value& self, const std::string& name, const CallArgs& args, int line) {
  const std::string& s = self.as_string();
  const std::string what = "str." + name;
  if (name == "startswith" || name == "endswith") {
    check_arity(args, 1, what, line);
    const Value* arg = argument(args, 0, "prefix");
    if (!arg) fail(line, what + " needs an argument");
    std::vector<std::string> options;
    if (arg->is_array()) {
      for (const Value& v : arg->as_array()) options.push_back(need_string(v, what, line));
    } else {
      options.push_back(need_string(*arg, what, line));
    }
    for (const std::string& o : options) {
      if (name == "startswith" ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                               : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0)
        return Value(true);
    }
    return Value(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_arity(args, 1, what, line);
    return Value(python_strip(s, optional_chars(args, what, line), name[0] == 's' ? 'b' : name[0]));
  }
  if (name == "split" || name == "rsplit") {
    check_arity(args, 2, what, line);
    return Value(split_string(s, argument(args, 0, "sep"), argument(args, 1, "maxsplit"), name == "rsplit", line));
  }
  if (name == "splitlines") {
    check_arity(args, 0, what, line);
    Array out;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t end = s.find_first_of("\r\n", pos);
      if (end == std::string::npos) {
        out.emplace_back(s.substr(pos));
        break;
      }
      out.emplace_back(s.substr(pos, end - pos));
      pos = end + ((s[end] == '\r' && end + 1 < s.size() && s[end + 1] == '\n') ? 2 : 1);
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    check_arity(args, 3, what, line);
    const Value* old = argument(args, 0, "old");
    const Value* now = argument(args, 1, "new");
    if (!old || !now) fail(line, what + " needs two arguments");
    const Value* count = argument(args, 2, "count");
    return Value(replace_all(s, need_string(*old, what, line), need_string(*now, what, line),
                             count ? need_int(*count, what, line) : -1));
  }
  if (name == "upper" || name == "lower") {
    check_arity(args, 0, what, line);
    return Value(ascii_case(s, name == "upper", what, line));
  }
  if (name == "title" || name == "capitalize") {
    check_arity(args, 0, what, line);
    return Value(title_case(s, name == "capitalize", what, line));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    check_arity(args, 1, what, line);
    const Value* needle = argument(args, 0, "sub");
    if (!needle) fail(line, what + " needs an argument");
    const std::string& n = need_string(*needle, what, line);
    if (name == "count") return Value(count_occurrences(s, n));
    const size_t at = name == "find" ? s.find(n) : s.rfind(n);
    return Value(at == std::string::npos ? int64_t{-1} : code_point_index(s, at));
  }
  if (name == "join") {
    check_arity(args, 1, what, line);
    const Value* items = argument(args, 0, "iterable");
    if (!items) fail(line, what + " needs an argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*items, what, line)) {
      if (!first) out += s;
      first = false;
      out += need_string(item, what, line);
    }
    return Value(std::move(out));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    check_arity(args, 0, what, line);
    if (s.empty()) return Value(false);
    for (unsigned char c : s) {
      if (c >= 0x80) fail(line, fmt::format("{} of non-ASCII text is not supported", what));
      const bool ok = name == "isdigit" ? std::isdigit(c) : name == "isspace" ? std::isspace(c)
                    : name == "isalpha" ? std::isalpha(c) : std::isalnum(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  fail(line, fmt::format("the string method '{}' is not supported", name));
}

Value dict_method(const Value& self, const std::string& name, const CallArgs& args, int line) {
  const std::string what = "dict." + name;
  if (name == "get") {
    check_arity(args, 2, what, line);
    const Value* key = argument(args, 0, "key");
    if (!key) fail(line, what + " needs a key");
    const Value* found = key->is_string() ? self.as_object()->find(key->as_string()) : nullptr;
    if (found) return *found;
    const Value* fallback = argument(args, 1, "default");
    return fallback ? *fallback : Value::none();
  }
  check_arity(args, 0, what, line);
  if (name == "items") return Value(dict_items(self));
  Array out;
  for (const auto& [key, value] : self.as_object()->entries) out.push_back(name == "keys" ? Value(key) : value);
  return Value(std::move(out));
}

}  // namespace

std::string python_strip(const std::string& text, const std::optional<std::string>& chars, char which) {
  const std::vector<std::string> cps = code_points(text);
  std::vector<std::string> strip_set;
  if (chars) strip_set = code_points(*chars);
  auto strippable = [&](const std::string& cp) {
    if (!chars) return is_space_piece(cp);
    return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
  };
  size_t begin = 0, end = cps.size();
  if (which != 'r')
    while (begin < end && strippable(cps[begin])) ++begin;
  if (which != 'l')
    while (end > begin && strippable(cps[end - 1])) --end;
  return join(cps, begin, end);
}

Value bound_method(const Value& value, const std::string& name, int line) {
  static const char* kStringMethods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                         "splitlines", "replace", "upper", "lower", "title", "capitalize", "find",
                                         "rfind", "count", "join", "isdigit", "isspace", "isalpha", "isalnum"};
  static const char* kDictMethods[] = {"get", "items", "keys", "values"};
  if (value.is_string()) {
    for (const char* m : kStringMethods)
      if (name == m)
        return Value::function("str." + name, [value, name, line](const CallArgs& args) {
          return string_method(value, name, args, line);
        });
  } else if (value.is_object() && !value.as_object()->is_namespace) {
    for (const char* m : kDictMethods)
      if (name == m)
        return Value::function("dict." + name, [value, name, line](const CallArgs& args) {
          return dict_method(value, name, args, line);
        });
  }
  return Value();
}

Value apply_filter(const std::string& name, const Value& value, const CallArgs& args, int line) {
  const std::string what = "filter '" + name + "'";
  if (name == "trim") {
    check_arity(args, 1, what, line);
    return Value(python_strip(need_string(value.is_undefined() ? Value("") : value, what, line),
                              optional_chars(args, what, line), 'b'));
  }
  if (name == "tojson") {
    check_arity(args, 1, what, line);
    const Value* indent = argument(args, 0, "indent");
    std::optional<int> width;
    if (indent && !indent->is_none()) width = static_cast<int>(need_int(*indent, what, line));
    try {
      return Value(to_json(value, width));
    } catch (const Error& e) {
      fail(line, e.what());
    }
  }
  if (name == "length" || name == "count") {
    check_arity(args, 0, what, line);
    return length_of(value, line);
  }
  if (name == "upper" || name == "lower") {
    check_arity(args, 0, what, line);
    return Value(ascii_case(value.str(), name == "upper", what, line));
  }
  if (name == "title" || name == "capitalize") {
    check_arity(args, 0, what, line);
    return Value(title_case(value.str(), name == "capitalize", what, line));
  }
  if (name == "string") {
    check_arity(args, 0, what, line);
    return Value(value.str());
  }
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    check_arity(args, 0, what, line);
    if (name != "safe") fail(line, fmt::format("{} (HTML escaping) is not supported", what));
    return value;
  }
  if (name == "default" || name == "d") {
    check_arity(args, 2, what, line);
    const Value* fallback = argument(args, 0, "default_value");
    const Value* boolean = argument(args, 1, "boolean");
    const bool use = value.is_undefined() || (boolean && boolean->truthy() && !value.truthy());
    return use ? (fallback ? *fallback : Value("")) : value;
  }
  if (name == "first" || name == "last") {
    check_arity(args, 0, what, line);
    const Array items = iterate(value, what, line);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    check_arity(args, 2, what, line);
    const Value* sep = argument(args, 0, "d");
    const Value* attribute = argument(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(value, what, line)) {
      if (!first) out += sep ? need_string(*sep, what, line) : "";
      first = false;
      out += (attribute ? attribute_of(item, need_string(*attribute, what, line), line) : item).str();
    }
    return Value(std::move(out));
  }
  if (name == "items" || name == "dictsort") {
    if (name == "dictsort") fail(line, fmt::format("{} is not supported", what));
    check_arity(args, 0, what, line);
    if (value.is_undefined()) return Value(Array{});
    if (!value.is_object() || value.as_object()->is_namespace) fail(line, fmt::format("{} needs a dict, got {}", what, value.type_name()));
    return Value(dict_items(value));
  }
  if (name == "list") {
    check_arity(args, 0, what, line);
    return Value(iterate(value, what, line));
  }
  if (name == "reverse") {
    check_arity(args, 0, what, line);
    if (value.is_string()) {
      std::vector<std::string> cps = code_points(value.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value(join(cps, 0, cps.size()));
    }
    Array items = iterate(value, what, line);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "int") {
    check_arity(args, 2, what, line);
    const Value* fallback = argument(args, 0, "default");
    if (value.is_number()) return Value(value.as_int());
    if (value.is_string()) {
      const std::string text = python_strip(value.as_string(), std::nullopt, 'b');
      try {
        size_t used = 0;
        const long long parsed = std::stoll(text, &used, 10);
        if (used == text.size()) return Value(static_cast<int64_t>(parsed));
        const double d = std::stod(text, &used);
        if (used == text.size()) return Value(static_cast<int64_t>(d));
      } catch (const std::exception&) {
      }
    }
    return fallback ? *fallback : Value(int64_t{0});
  }
  if (name == "float") {
    check_arity(args, 1, what, line);
    if (value.is_number()) return Value(value.as_double());
    if (value.is_string()) {
      try {
        size_t used = 0;
        const double d = std::stod(value.as_string(), &used);
        if (used == value.as_string().size()) return Value(d);
      } catch (const std::exception&) {
      }
    }
    const Value* fallback = argument(args, 0, "default");
    return fallback ? *fallback : Value(0.0);
  }
  if (name == "abs") {
    check_arity(args, 0, what, line);
    if (value.kind() == Value::Kind::floating) return Value(std::fabs(value.as_double()));
    if (value.is_number()) return Value(static_cast<int64_t>(std::llabs(value.as_int())));
    fail(line, fmt::format("{} needs a number, got {}", what, value.type_name()));
  }
  if (name == "replace") {
    check_arity(args, 3, what, line);
    const Value* old = argument(args, 0, "old");
    const Value* now = argument(args, 1, "new");
    if (!old || !now) fail(line, what + " needs two arguments");
    const Value* count = argument(args, 2, "count");
    return Value(replace_all(value.str(), need_string(*old, what, line), need_string(*now, what, line),
                             count && !count->is_none() ? need_int(*count, what, line) : -1));
  }
  if (name == "map") {
    const Value* attribute = nullptr;
    for (const auto& [k, v] : args.keywords)
      if (k == "attribute") attribute = &v;
    Array out;
    if (attribute) {
      const Value* fallback = nullptr;
      for (const auto& [k, v] : args.keywords)
        if (k == "default") fallback = &v;
      for (const Value& item : iterate(value, what, line)) {
        Value got = attribute_of(item, need_string(*attribute, what, line), line);
        out.push_back(got.is_undefined() && fallback ? *fallback : got);
      }
      return Value(std::move(out));
    }
    if (args.positional.empty()) fail(line, what + " needs a filter name or attribute=");
    const std::string filter = need_string(args.positional[0], what, line);
    const CallArgs filter_args = rest_args(args, 1);
    for (const Value& item : iterate(value, what, line)) out.push_back(apply_filter(filter, item, filter_args, line));
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject") return select_items(value, args, false, name == "select", line);
  if (name == "selectattr" || name == "rejectattr") return select_items(value, args, true, name == "selectattr", line);
  if (name == "unique") {
    check_arity(args, 0, what, line);
    Array out;
    for (const Value& item : iterate(value, what, line))
      if (std::none_of(out.begin(), out.end(), [&](const Value& seen) { return equal(seen, item); })) out.push_back(item);
    return Value(std::move(out));
  }
  if (name == "sort") return sort_items(value, args, line);
  if (name == "min" || name == "max") {
    const Array items = iterate(value, what, line);
    if (items.empty()) return Value();
    Value best = items[0];
    for (const Value& item : items) {
      const std::optional<bool> lt = name == "min" ? less(item, best) : less(best, item);
      if (!lt) fail(line, fmt::format("{}: cannot order {} and {}", what, item.type_name(), best.type_name()));
      if (*lt) best = item;
    }
    return best;
  }
  if (name == "sum") {
    const Value* attribute = argument(args, 0, "attribute");
    Value total = argument(args, 1, "start") ? *argument(args, 1, "start") : Value(int64_t{0});
    for (const Value& raw : iterate(value, what, line)) {
      const Value item = attribute ? attribute_of(raw, need_string(*attribute, what, line), line) : raw;
      if (!item.is_number() || !total.is_number()) fail(line, fmt::format("{} needs numbers, got {}", what, item.type_name()));
      if (item.kind() == Value::Kind::floating || total.kind() == Value::Kind::floating)
        total = Value(total.as_double() + item.as_double());
      else
        total = Value(total.as_int() + item.as_int());
    }
    return total;
  }
  if (name == "indent") return indent_text(value, args, line);
  if (name == "wordcount") {
    check_arity(args, 0, what, line);
    return Value(static_cast<int64_t>(split_string(value.str(), nullptr, nullptr, false, line).size()));
  }
  if (name == "round") {
    check_arity(args, 2, what, line);
    if (!value.is_number()) fail(line, fmt::format("{} needs a number", what));
    const Value* precision = argument(args, 0, "precision");
    const int64_t digits = precision ? need_int(*precision, what, line) : 0;
    const double scale = std::pow(10.0, static_cast<double>(digits));
    return Value(std::nearbyint(value.as_double() * scale) / scale);
  }
  fail(line, fmt::format("{} is not supported by shardlm's template interpreter", what));
}

bool apply_test(const std::string& name, const Value& value, const CallArgs& args, int line) {
  const std::string what = "test '" + name + "'";
  auto operand = [&]() -> const Value& {
    if (args.positional.size() != 1 || !args.keywords.empty()) fail(line, what + " takes one argument");
    return args.positional[0];
  };
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.is_none();
  if (name == "boolean") return value.kind() == Value::Kind::boolean;
  if (name == "true") return value.kind() == Value::Kind::boolean && value.as_bool();
  if (name == "false") return value.kind() == Value::Kind::boolean && !value.as_bool();
  if (name == "integer") return value.kind() == Value::Kind::integer;
  if (name == "float") return value.kind() == Value::Kind::floating;
  if (name == "number") return value.is_number();
  if (name == "string") return value.is_string();
  if (name == "mapping") return value.is_object() && !value.as_object()->is_namespace;
  if (name == "iterable")
    return value.is_undefined() || value.is_string() || value.is_array() ||
           (value.is_object() && !value.as_object()->is_namespace);
  if (name == "sequence") return value.is_string() || value.is_array() || (value.is_object() && !value.as_object()->is_namespace);
  if (name == "callable") return value.is_function() || value.is_undefined();  // jinja2's Undefined is callable
  if (name == "sameas") {
    const Value& other = operand();
    if (value.kind() != other.kind()) return false;
    if (value.is_object()) return value.as_object() == other.as_object();
    return equal(value, other);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(value, operand());
  if (name == "ne" || name == "!=") return !equal(value, operand());
  if (name == "lt" || name == "<" || name == "le" || name == "<=" || name == "gt" || name == ">" || name == "ge" ||
      name == ">=") {
    const Value& other = operand();
    const bool flip = name[0] == 'g' || name[0] == '>';
    const std::optional<bool> lt = flip ? less(other, value) : less(value, other);
    if (!lt) fail(line, fmt::format("{}: cannot order {} and {}", what, value.type_name(), other.type_name()));
    const bool or_equal = name == "le" || name == "<=" || name == "ge" || name == ">=";
    return *lt || (or_equal && equal(value, other));
  }
  if (name == "in") {
    const Value& container = operand();
    if (container.is_string()) return value.is_string() && container.as_string().find(value.as_string()) != std::string::npos;
    for (const Value& item : iterate(container, what, line))
      if (equal(item, value)) return true;
    return false;
  }
  if (name == "even" || name == "odd") {
    const int64_t n = need_int(value, what, line);
    return (n % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const int64_t d = need_int(operand(), what, line);
    if (d == 0) fail(line, what + ": division by zero");
    return need_int(value, what, line) % d == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string& s = need_string(value, what, line);
    return ascii_case(s, name == "upper", what, line) == s;
  }
  fail(line, fmt::format("{} is not supported by shardlm's template interpreter", what));
}

}  // namespace shardlm::jinja
