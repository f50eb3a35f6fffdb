// The values a chat template computes with: Python's as Jinja sees them
// (undefined, None, bool, int, float, str, list, dict, callables), with
// Python's semantics where templates depend on them (truthiness, ==, str(),
// code-point length and slicing of strings, insertion-ordered dicts).
// Lists and dicts are immutable once made (transformers renders with
// ImmutableSandboxedEnvironment); namespace() objects are the one mutable kind.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::jinja {

class Value;

// Arguments of a call: f(a, b, key=c).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

using Array = std::vector<Value>;
struct Object;
using Function = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, array, object, function };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(Array a);
  static Value tuple(Array a);  // a list that prints as Python prints a tuple
  Value(std::shared_ptr<Object> o);
  static Value function(std::string name, Function f);
  // JSON: null -> None; objects keep the key order of the JSON value
  // (ordered_json: as written; json: sorted, as nlohmann keeps them).
  static Value from_json(const nlohmann::json& json);
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::floating || kind_ == Kind::boolean; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }
  bool is_function() const { return kind_ == Kind::function; }
  bool is_tuple() const { return tuple_; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const;     // bool and int (floats are truncated, as int())
  double as_double() const;   // bool, int, float
  const std::string& as_string() const { return *string_; }
  const Array& as_array() const { return *array_; }
  const std::shared_ptr<Object>& as_object() const { return object_; }
  const Function& as_function() const { return *function_; }
  const std::string& function_name() const { return *string_; }

  // Python truthiness (undefined is false).
  bool truthy() const;
  // Python's str(): None -> "None", True -> "True", 1.0 -> "1.0", lists/dicts as repr.
  std::string str() const;
  // Python's repr() ('text' quoted as Python quotes it).
  std::string repr() const;
  // What Jinja calls the type in messages: "str", "list", "dict", "undefined", ...
  std::string type_name() const;

 private:
  Kind kind_ = Kind::undefined;
  bool bool_ = false;
  bool tuple_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const Array> array_;
  std::shared_ptr<Object> object_;
  std::shared_ptr<const Function> function_;
};

// A dict (string keys, insertion order) or a namespace() object.
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);  // replaces in place or appends
};

Value make_object(std::vector<std::pair<std::string, Value>> entries, bool is_namespace = false);

// Python ==: numbers by value (True == 1), strings, lists and dicts deeply.
bool equal(const Value& a, const Value& b);
// Python <: numbers, strings (by code point), lists lexicographically; nullopt
// when Python would raise TypeError.
std::optional<bool> less(const Value& a, const Value& b);

// The code points of UTF-8 text (invalid bytes kept one per "code point", so
// joining the pieces gives the text back).
std::vector<std::string> code_points(std::string_view text);

// transformers' tojson: json.dumps(value, ensure_ascii=False, indent=indent)
// (separators ", " and ": " without indent, "," and ": " with it; keys in order).
// Error (naming the type) for undefined or a callable.
std::string to_json(const Value& value, std::optional<int> indent);

}  // namespace shardlm::jinja
