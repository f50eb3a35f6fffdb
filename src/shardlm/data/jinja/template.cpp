#include "shardlm/data/jinja/template.hpp"

#include <cmath>
#include <ctime>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "shardlm/core/error.hpp"
#include "shardlm/data/jinja/builtins.hpp"
#include "shardlm/data/jinja/parser.hpp"

namespace shardlm::jinja {
namespace {

using Frame = std::map<std::string, Value, std::less<>>;
using Scopes = std::vector<std::shared_ptr<Frame>>;

enum class Flow { normal, loop_break, loop_continue };

// Python's slice of a sequence of `size` items: the indices taken.
std::vector<size_t> slice_indices(int64_t size, const Value& start_v, const Value& stop_v, const Value& step_v,
                                  int line) {
  auto as_index = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (v.kind() != Value::Kind::integer && v.kind() != Value::Kind::boolean)
      fail(line, fmt::format("slice {} must be an integer, got {}", what, v.type_name()));
    return v.as_int();
  };
  const int64_t step = as_index(step_v, "step").value_or(1);
  if (step == 0) fail(line, "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> i, int64_t fallback) {
    if (!i) return fallback;
    int64_t v = *i < 0 ? *i + size : *i;
    if (step > 0) return std::clamp<int64_t>(v, 0, size);
    return std::clamp<int64_t>(v, -1, size - 1);
  };
  const int64_t start = clamp(as_index(start_v, "start"), step > 0 ? 0 : size - 1);
  const int64_t stop = clamp(as_index(stop_v, "stop"), step > 0 ? size : -1);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

class Renderer {
 public:
  Renderer(const Variables& variables) {
    auto root = std::make_shared<Frame>();
    (*root)["namespace"] = Value::function("namespace", [](const CallArgs& args) {
      if (!args.positional.empty()) throw Error("namespace() takes keyword arguments only");
      return make_object(args.keywords, /*is_namespace=*/true);
    });
    (*root)["dict"] = Value::function("dict", [](const CallArgs& args) {
      if (!args.positional.empty()) throw Error("dict() takes keyword arguments only here");
      return make_object(args.keywords);
    });
    (*root)["range"] = Value::function("range", [](const CallArgs& args) {
      std::vector<int64_t> n;
      for (const Value& v : args.positional) {
        if (v.kind() != Value::Kind::integer) throw Error("range() takes integers");
        n.push_back(v.as_int());
      }
      if (n.empty() || n.size() > 3 || !args.keywords.empty()) throw Error("range() takes 1 to 3 integers");
      const int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0], step = n.size() > 2 ? n[2] : 1;
      if (step == 0) throw Error("range() step cannot be zero");
      if ((stop - start) / step > 10000000) throw Error("range() of more than 10,000,000 items");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
      return Value(std::move(out));
    });
    (*root)["raise_exception"] = Value::function("raise_exception", [](const CallArgs& args) -> Value {
      const std::string message = args.positional.empty() ? std::string() : args.positional[0].str();
      throw Error("raise_exception: " + message);
    });
    for (const auto& [name, value] : variables) (*root)[name] = value;
    scopes_.push_back(std::move(root));
  }

  void render(const Body& body, std::string& out) {
    if (exec(body, out) != Flow::normal) fail(0, "{% break %} or {% continue %} outside a loop");
  }

 private:
  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    return Value();
  }
  void assign(const std::string& name, Value value) { (*scopes_.back())[name] = std::move(value); }

  Flow exec(const Body& body, std::string& out) {
    for (const NodePtr& node : body) {
      const Flow flow = exec_node(*node, out);
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow exec_node(const Node& node, std::string& out) {
    switch (node.kind) {
      case Node::Kind::text: out += node.text; return Flow::normal;
      case Node::Kind::output: out += eval(*node.expr).str(); return Flow::normal;
      case Node::Kind::if_chain:
        for (const auto& [condition, body] : node.branches)
          if (!condition || eval(*condition).truthy()) return exec(body, out);
        return Flow::normal;
      case Node::Kind::for_loop: exec_for(node, out); return Flow::normal;
      case Node::Kind::set: {
        Value value = eval(*node.expr);
        if (!node.attribute.empty()) {
          const Value target = lookup(node.targets[0]);
          if (!target.is_object() || !target.as_object()->is_namespace)
            fail(node.line, fmt::format("cannot set attribute '{}' of '{}' ({}): only namespace() objects take "
                                        "attribute assignment", node.attribute, node.targets[0], target.type_name()));
          target.as_object()->set(node.attribute, std::move(value));
        } else {
          bind_targets(node.targets, value, node.line, [&](const std::string& n, Value v) { assign(n, std::move(v)); });
        }
        return Flow::normal;
      }
      case Node::Kind::set_block: {
        std::string text;
        render_nested(node.body, text, node.line);
        assign(node.targets[0], Value(std::move(text)));
        return Flow::normal;
      }
      case Node::Kind::macro: assign(node.name, make_macro(node, scopes_)); return Flow::normal;
      case Node::Kind::call_block: {
        const Value caller = make_macro(node, scopes_);
        const Expr& call = *node.expr;
        const Value callee = eval(*call.a);
        CallArgs args = eval_args(call);
        args.keywords.emplace_back("caller", caller);
        out += invoke(callee, args, call.line).str();
        return Flow::normal;
      }
      case Node::Kind::filter_block: {
        std::string text;
        render_nested(node.body, text, node.line);
        scopes_.push_back(std::make_shared<Frame>());
        assign(kFilterBlockInput, Value(std::move(text)));
        const Value filtered = eval(*node.expr);
        scopes_.pop_back();
        out += filtered.str();
        return Flow::normal;
      }
      case Node::Kind::loop_break: return Flow::loop_break;
      case Node::Kind::loop_continue: return Flow::loop_continue;
      case Node::Kind::generation: return exec(node.body, out);
    }
    return Flow::normal;
  }

  void render_nested(const Body& body, std::string& out, int line) {
    if (exec(body, out) != Flow::normal) fail(line, "{% break %} or {% continue %} outside a loop");
  }

  template <typename Bind>
  void bind_targets(const std::vector<std::string>& targets, const Value& value, int line, Bind bind) {
    if (targets.size() == 1) {
      bind(targets[0], value);
      return;
    }
    if (!value.is_array() || value.as_array().size() != targets.size())
      fail(line, fmt::format("cannot unpack {} into {} names", value.repr(), targets.size()));
    for (size_t i = 0; i < targets.size(); ++i) bind(targets[i], value.as_array()[i]);
  }

  Array items_of(const Value& v, int line) {
    switch (v.kind()) {
      case Value::Kind::undefined: return {};
      case Value::Kind::array: return v.as_array();
      case Value::Kind::string:
      case Value::Kind::object: return apply_filter("list", v, {}, line).as_array();
      default: fail(line, fmt::format("a {} is not iterable", v.type_name()));
    }
  }

  void exec_for(const Node& node, std::string& out) {
    Array items = items_of(eval(*node.expr), node.line);
    if (node.condition) {
      Array kept;
      for (const Value& item : items) {
        scopes_.push_back(std::make_shared<Frame>());
        bind_targets(node.targets, item, node.line, [&](const std::string& n, Value v) { assign(n, std::move(v)); });
        const bool keep = eval(*node.condition).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      render_nested(node.else_body, out, node.line);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.push_back(std::make_shared<Frame>());
      const Value previous = i > 0 ? items[static_cast<size_t>(i - 1)] : Value();
      const Value following = i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value();
      const int64_t index0 = i;
      Value loop = make_object({{"index", Value(i + 1)},
                                {"index0", Value(i)},
                                {"revindex", Value(n - i)},
                                {"revindex0", Value(n - i - 1)},
                                {"first", Value(i == 0)},
                                {"last", Value(i == n - 1)},
                                {"length", Value(n)},
                                {"depth", Value(int64_t{1})},
                                {"depth0", Value(int64_t{0})},
                                {"previtem", previous},
                                {"nextitem", following},
                                {"cycle", Value::function("loop.cycle", [index0](const CallArgs& args) {
                                   if (args.positional.empty()) throw Error("loop.cycle() needs at least one value");
                                   return args.positional[static_cast<size_t>(index0) % args.positional.size()];
                                 })}});
      assign("loop", std::move(loop));
      bind_targets(node.targets, items[static_cast<size_t>(i)], node.line,
                   [&](const std::string& name, Value v) { assign(name, std::move(v)); });
      const Flow flow = exec(node.body, out);
      scopes_.pop_back();
      if (flow == Flow::loop_break) break;
    }
  }

  // A macro (or a call block's caller) as a callable: its body renders in a
  // fresh scope over the scopes where it was defined.
  Value make_macro(const Node& node, const Scopes& defined_in) {
    const Node* macro = &node;
    Scopes closure = defined_in;
    const std::string name = node.kind == Node::Kind::macro ? node.name : "caller";
    return Value::function(name, [this, macro, closure, name](const CallArgs& args) {
      if (args.positional.size() > macro->params.size())
        fail(macro->line, fmt::format("macro '{}' takes {} argument(s), {} given", name, macro->params.size(),
                                      args.positional.size()));
      Scopes saved = std::move(scopes_);
      scopes_ = closure;
      scopes_.push_back(std::make_shared<Frame>());
      std::string text;
      try {
        for (size_t i = 0; i < macro->params.size(); ++i) {
          const MacroParam& param = macro->params[i];
          Value value;
          bool given = false;
          if (i < args.positional.size()) {
            value = args.positional[i];
            given = true;
          }
          for (const auto& [k, v] : args.keywords)
            if (k == param.name) {
              value = v;
              given = true;
            }
          if (!given && param.default_value) value = eval(*param.default_value);
          assign(param.name, value);
        }
        for (const auto& [k, v] : args.keywords) {
          bool known = k == "caller";
          for (const MacroParam& param : macro->params) known = known || param.name == k;
          if (!known) fail(macro->line, fmt::format("macro '{}' has no parameter '{}'", name, k));
          if (k == "caller") assign("caller", v);
        }
        render_nested(macro->body, text, macro->line);
      } catch (...) {
        scopes_ = std::move(saved);
        throw;
      }
      scopes_ = std::move(saved);
      return Value(std::move(text));
    });
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs args;
    for (const ExprPtr& item : e.items) args.positional.push_back(eval(*item));
    for (const auto& [key, item] : e.keywords) args.keywords.emplace_back(key, eval(*item));
    return args;
  }

  Value invoke(const Value& callee, const CallArgs& args, int line) {
    if (!callee.is_function()) fail(line, fmt::format("a {} is not callable", callee.type_name()));
    try {
      return callee.as_function()(args);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind("chat template line ", 0) == 0) throw;
      fail(line, what);
    }
  }

  Value attribute(const Value& object, const std::string& name, int line) {
    if (object.is_undefined()) fail(line, fmt::format("'{}' of an undefined value", name));
    if (object.is_object()) {
      // Jinja tries Python attributes first: dict methods win over keys of the same name.
      Value method = bound_method(object, name, line);
      if (!method.is_undefined()) return method;
      const Value* found = object.as_object()->find(name);
      return found ? *found : Value();
    }
    Value method = bound_method(object, name, line);
    if (!method.is_undefined()) return method;
    if (object.is_string() || object.is_array() || object.is_function() || object.is_none() || object.is_number())
      return Value();
    fail(line, fmt::format("attribute '{}' of a {}", name, object.type_name()));
  }

  Value subscript(const Value& object, const Value& key, int line) {
    if (object.is_undefined()) fail(line, fmt::format("[{}] of an undefined value", key.repr()));
    if (object.is_object()) {
      if (!key.is_string()) return Value();
      const Value* found = object.as_object()->find(key.as_string());
      if (found) return *found;
      return bound_method(object, key.as_string(), line);
    }
    if (object.is_array() || object.is_string()) {
      if (key.is_string()) return attribute(object, key.as_string(), line);
      if (key.kind() != Value::Kind::integer && key.kind() != Value::Kind::boolean)
        fail(line, fmt::format("indices must be integers, not {}", key.type_name()));
      if (object.is_array()) {
        const Array& items = object.as_array();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value();
        return items[static_cast<size_t>(i)];
      }
      const std::vector<std::string> cps = code_points(object.as_string());
      int64_t i = key.as_int();
      if (i < 0) i += static_cast<int64_t>(cps.size());
      if (i < 0 || i >= static_cast<int64_t>(cps.size())) return Value();
      return Value(cps[static_cast<size_t>(i)]);
    }
    fail(line, fmt::format("a {} cannot be subscripted", object.type_name()));
  }

  Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") return Value(a.str() + b.str());
    if (a.is_undefined() || b.is_undefined())
      fail(line, fmt::format("an undefined value in '{}' (left {}, right {})", op, a.type_name(), b.type_name()));
    auto type_error = [&]() -> Value {
      fail(line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_array() && b.is_array()) {
        Array out = a.as_array();
        out.insert(out.end(), b.as_array().begin(), b.as_array().end());
        return Value(std::move(out));
      }
    }
    if (op == "*") {
      const Value* seq = a.is_string() || a.is_array() ? &a : b.is_string() || b.is_array() ? &b : nullptr;
      const Value* count = seq == &a ? &b : &a;
      if (seq && (count->kind() == Value::Kind::integer || count->kind() == Value::Kind::boolean)) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        if (seq->is_string()) {
          std::string out;
          for (int64_t i = 0; i < n; ++i) out += seq->as_string();
          return Value(std::move(out));
        }
        Array out;
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->as_array().begin(), seq->as_array().end());
        return Value(std::move(out));
      }
    }
    if (op == "%" && a.is_string()) fail(line, "string % formatting is not supported");
    if (!a.is_number() || !b.is_number()) return type_error();
    const bool floating = a.kind() == Value::Kind::floating || b.kind() == Value::Kind::floating;
    if (op == "/") {
      if (b.as_double() == 0.0) fail(line, "division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "**") {
      if (!floating && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    if (floating) {
      const double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (y == 0.0) fail(line, "division by zero");
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") return Value(x - std::floor(x / y) * y);
    } else {
      const int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (y == 0) fail(line, "division by zero");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
      if (op == "//") return Value(q);
      if (op == "%") return Value(x - q * y);
    }
    return type_error();
  }

  bool contains(const Value& container, const Value& item, int line) {
    if (container.is_string()) {
      if (!item.is_string())
        fail(line, fmt::format("'in <string>' needs a string on the left, got {}", item.type_name()));
      return container.as_string().find(item.as_string()) != std::string::npos;
    }
    if (container.is_object()) {
      if (container.as_object()->is_namespace) fail(line, "'in' of a namespace");
      return item.is_string() && container.as_object()->find(item.as_string()) != nullptr;
    }
    if (container.is_undefined()) return false;
    if (!container.is_array()) fail(line, fmt::format("'in' of a {}", container.type_name()));
    for (const Value& v : container.as_array())
      if (equal(v, item)) return true;
    return false;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        Array items;
        for (const ExprPtr& item : e.items) items.push_back(eval(*item));
        return e.kind == Expr::Kind::tuple ? Value::tuple(std::move(items)) : Value(std::move(items));
      }
      case Expr::Kind::dict: {
        std::vector<std::pair<std::string, Value>> entries;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value key = eval(*e.items[i]);
          if (!key.is_string()) fail(e.line, fmt::format("dict keys must be strings here, got {}", key.type_name()));
          entries.emplace_back(key.as_string(), eval(*e.items[i + 1]));
        }
        return make_object(std::move(entries));
      }
      case Expr::Kind::attribute: {
        const Value object = eval(*e.a);
        if (object.is_undefined() && e.a->kind == Expr::Kind::name)
          fail(e.line, fmt::format("'{}' is undefined (reading its attribute '{}')", e.a->name, e.name));
        return attribute(object, e.name, e.line);
      }
      case Expr::Kind::subscript: {
        const Value object = eval(*e.a);
        if (object.is_undefined() && e.a->kind == Expr::Kind::name)
          fail(e.line, fmt::format("'{}' is undefined (reading an item of it)", e.a->name));
        return subscript(object, eval(*e.b), e.line);
      }
      case Expr::Kind::slice: {
        const Value object = eval(*e.a);
        const Value start = e.items[0] ? eval(*e.items[0]) : Value();
        const Value stop = e.items[1] ? eval(*e.items[1]) : Value();
        const Value step = e.items[2] ? eval(*e.items[2]) : Value();
        if (object.is_array()) {
          Array out;
          for (size_t i : slice_indices(static_cast<int64_t>(object.as_array().size()), start, stop, step, e.line))
            out.push_back(object.as_array()[i]);
          return Value(std::move(out));
        }
        if (object.is_string()) {
          const std::vector<std::string> cps = code_points(object.as_string());
          std::string out;
          for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), start, stop, step, e.line)) out += cps[i];
          return Value(std::move(out));
        }
        fail(e.line, fmt::format("a {} cannot be sliced", object.type_name()));
      }
      case Expr::Kind::call: {
        const Value callee = eval(*e.a);
        if (callee.is_undefined()) {
          const std::string what = e.a->kind == Expr::Kind::name        ? "'" + e.a->name + "'"
                                   : e.a->kind == Expr::Kind::attribute ? "method '" + e.a->name + "'"
                                                                        : "the callee";
          fail(e.line, fmt::format("{} is undefined (not a function this interpreter provides)", what));
        }
        return invoke(callee, eval_args(e), e.line);
      }
      case Expr::Kind::filter: {
        const Value input = eval(*e.a);
        return apply_filter(e.name, input, eval_args(e), e.line);
      }
      case Expr::Kind::test: {
        const Value input = eval(*e.a);
        return Value(apply_test(e.name, input, eval_args(e), e.line) != e.negated);
      }
      case Expr::Kind::negate:
      case Expr::Kind::plus: {
        const Value v = eval(*e.a);
        if (!v.is_number()) fail(e.line, fmt::format("bad operand type for unary {}: '{}'", e.kind == Expr::Kind::negate ? '-' : '+', v.type_name()));
        if (e.kind == Expr::Kind::plus) return v.kind() == Value::Kind::boolean ? Value(v.as_int()) : v;
        return v.kind() == Value::Kind::floating ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::Kind::logical_not: return Value(!eval(*e.a).truthy());
      case Expr::Kind::logical_and: {
        Value left = eval(*e.a);
        return left.truthy() ? eval(*e.b) : left;
      }
      case Expr::Kind::logical_or: {
        Value left = eval(*e.a);
        return left.truthy() ? left : eval(*e.b);
      }
      case Expr::Kind::binary: return arithmetic(e.name, eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::compare: {
        const Value a = eval(*e.a);
        const Value b = eval(*e.b);
        if (e.name == "in") return Value(contains(b, a, e.line) != e.negated);
        if (e.name == "==") return Value(equal(a, b));
        if (e.name == "!=") return Value(!equal(a, b));
        const bool flip = e.name[0] == '>';
        const std::optional<bool> lt = flip ? less(b, a) : less(a, b);
        if (!lt) fail(e.line, fmt::format("'{}' not supported between {} and {}", e.name, a.type_name(), b.type_name()));
        return Value(*lt || (e.name.size() == 2 && equal(a, b)));
      }
      case Expr::Kind::conditional:
        if (eval(*e.a).truthy()) return eval(*e.b);
        return e.c ? eval(*e.c) : Value();
    }
    return Value();
  }

  Scopes scopes_;
};

}  // namespace

Template::Template(std::string_view source, const LexerOptions& options) : body_(parse(tokenize(source, options))) {}
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

std::string Template::render(const Variables& variables) const {
  Renderer renderer(variables);
  std::string out;
  renderer.render(body_, out);
  return out;
}

Value strftime_now_at(int64_t unix_seconds) {
  return Value::function("strftime_now", [unix_seconds](const CallArgs& args) {
    if (args.positional.size() != 1 || !args.positional[0].is_string() || !args.keywords.empty())
      throw Error("strftime_now() takes one format string");
    const std::time_t t = static_cast<std::time_t>(unix_seconds);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buffer[256];
    const size_t n = std::strftime(buffer, sizeof(buffer), args.positional[0].as_string().c_str(), &tm);
    if (n == 0 && !args.positional[0].as_string().empty()) throw Error("strftime_now(): the format gives nothing or too much");
    return Value(std::string(buffer, n));
  });
}

}  // namespace shardlm::jinja
