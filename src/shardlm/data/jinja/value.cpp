#include "shardlm/data/jinja/value.hpp"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/data/utf8.hpp"

namespace shardlm::jinja {

Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}
Value::Value(bool b) : kind_(Kind::boolean), bool_(b) {}
Value::Value(int64_t i) : kind_(Kind::integer), int_(i) {}
Value::Value(double d) : kind_(Kind::floating), double_(d) {}
Value::Value(std::string s) : kind_(Kind::string), string_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(Array a) : kind_(Kind::array), array_(std::make_shared<const Array>(std::move(a))) {}
Value Value::tuple(Array a) {
  Value v(std::move(a));
  v.tuple_ = true;
  return v;
}
Value::Value(std::shared_ptr<Object> o) : kind_(Kind::object), object_(std::move(o)) {}

Value Value::function(std::string name, Function f) {
  Value v;
  v.kind_ = Kind::function;
  v.string_ = std::make_shared<const std::string>(std::move(name));
  v.function_ = std::make_shared<const Function>(std::move(f));
  return v;
}

namespace {

template <typename Json>
Value value_from_json(const Json& json) {
  switch (json.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value(json.template get<bool>());
    case Json::value_t::number_integer: return Value(json.template get<int64_t>());
    case Json::value_t::number_unsigned: return Value(static_cast<int64_t>(json.template get<uint64_t>()));
    case Json::value_t::number_float: return Value(json.template get<double>());
    case Json::value_t::string: return Value(json.template get<std::string>());
    case Json::value_t::array: {
      Array items;
      for (const auto& item : json) items.push_back(value_from_json(item));
      return Value(std::move(items));
    }
    case Json::value_t::object: {
      std::vector<std::pair<std::string, Value>> entries;
      for (const auto& [key, item] : json.items()) entries.emplace_back(key, value_from_json(item));
      return make_object(std::move(entries));
    }
    default: throw Error("chat template: a binary JSON value cannot be a template variable");
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& json) { return value_from_json(json); }
Value Value::from_json(const nlohmann::ordered_json& json) { return value_from_json(json); }

int64_t Value::as_int() const {
  if (kind_ == Kind::boolean) return bool_ ? 1 : 0;
  if (kind_ == Kind::floating) return static_cast<int64_t>(double_);
  return int_;
}

double Value::as_double() const {
  if (kind_ == Kind::floating) return double_;
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return bool_;
    case Kind::integer: return int_ != 0;
    case Kind::floating: return double_ != 0.0;
    case Kind::string: return !string_->empty();
    case Kind::array: return !array_->empty();
    case Kind::object: return object_->is_namespace || !object_->entries.empty();
    case Kind::function: return true;
  }
  return false;
}

namespace {

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string text = fmt::format("{}", d);
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string python_string_repr(const std::string& s) {
  const char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, std::optional<int> indent, int depth) {
  auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(*indent * level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d);
      return;
    }
    case Value::Kind::string: json_string(out, v.as_string()); return;
    case Value::Kind::array: {
      const Array& items = v.as_array();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += indent ? "," : ", ";
        if (indent) newline(depth + 1);
        json_dump(out, items[i], indent, depth + 1);
      }
      if (indent) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::object: {
      const auto& entries = v.as_object()->entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += indent ? "," : ", ";
        if (indent) newline(depth + 1);
        json_string(out, entries[i].first);
        out += ": ";
        json_dump(out, entries[i].second, indent, depth + 1);
      }
      if (indent) newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::undefined:
    case Value::Kind::function:
      throw Error(fmt::format("tojson: a {} is not JSON serializable", v.type_name()));
  }
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return bool_ ? "True" : "False";
    case Kind::integer: return std::to_string(int_);
    case Kind::floating: return python_float(double_);
    case Kind::string: return *string_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::string: return python_string_repr(*string_);
    case Kind::array: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < array_->size(); ++i) out += (i ? ", " : "") + (*array_)[i].repr();
      if (tuple_) return out + (array_->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::object: {
      if (object_->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < object_->entries.size(); ++i)
        out += (i ? ", " : "") + python_string_repr(object_->entries[i].first) + ": " + object_->entries[i].second.repr();
      return out + "}";
    }
    case Kind::function: return "<function " + *string_ + ">";
    default: return str();
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "undefined";
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::array: return "list";
    case Kind::object: return object_->is_namespace ? "namespace" : "dict";
    case Kind::function: return "function";
  }
  return "?";
}

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(key, std::move(value));
}

Value make_object(std::vector<std::pair<std::string, Value>> entries, bool is_namespace) {
  auto object = std::make_shared<Object>();
  for (auto& [key, value] : entries) object->set(key, std::move(value));
  object->is_namespace = is_namespace;
  return Value(std::move(object));
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::floating || b.kind() == Value::Kind::floating) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.as_string() == b.as_string();
    case Value::Kind::array: {
      const Array &x = a.as_array(), &y = b.as_array();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::object: {
      if (a.as_object() == b.as_object()) return true;
      if (a.as_object()->is_namespace || b.as_object()->is_namespace) return false;
      const auto &x = a.as_object()->entries, &y = b.as_object()->entries;
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x) {
        const Value* other = b.as_object()->find(key);
        if (!other || !equal(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::function: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

std::optional<bool> less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::floating || b.kind() == Value::Kind::floating) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  // UTF-8 byte order is code point order.
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return std::nullopt;
}

std::vector<std::string> code_points(std::string_view text) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t at = pos;
    if (!utf8::decode(text, pos)) pos = at + 1;
    out.emplace_back(text.substr(at, pos - at));
  }
  return out;
}

std::string to_json(const Value& value, std::optional<int> indent) {
  std::string out;
  json_dump(out, value, indent, 0);
  return out;
}

}  // namespace shardlm::jinja
