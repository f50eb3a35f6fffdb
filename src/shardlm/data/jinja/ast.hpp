// The parsed template: statements (Node) holding expressions (Expr), each with
// the template line it came from for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/data/jinja/value.hpp"

namespace shardlm::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,      // value
    name,         // name
    list,         // items
    tuple,        // items
    dict,         // items: key, value, key, value, ...
    attribute,    // a.name
    subscript,    // a[b]
    slice,        // a[b:c:d]; missing parts are null pointers
    call,         // a(items..., keywords...)
    filter,       // a | name(items..., keywords...)
    test,         // a is [not] name(items...)
    negate,       // -a
    plus,         // +a
    logical_not,  // not a
    logical_and,  // a and b
    logical_or,   // a or b
    binary,       // a name b: + - * / // % ** ~
    compare,      // a name b: == != < <= > >= in, negated for "not in"
    conditional,  // b if a else c (c may be null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  ExprPtr a, b, c;
  bool negated = false;
};

// The variable a {% filter %} block's body is bound to while its filters run
// (no identifier can spell it).
inline constexpr const char* kFilterBlockInput = " filter body";

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  enum class Kind {
    text,          // text
    output,        // {{ expr }}
    if_chain,      // branches (condition, body); a null condition is else
    for_loop,      // for targets in expr [if condition]: body [else: else_body]
    set,           // set targets = expr, or set target.attribute = expr (attribute non-empty)
    set_block,     // set targets[0] %}body{% endset
    macro,         // macro name(params): body
    call_block,    // call(params) expr: body (the caller)
    filter_block,  // filter expr(on a placeholder): body
    loop_break,
    loop_continue,
    generation,    // {% generation %}body{% endgeneration %} (transformers' assistant marker): renders body
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::string name;
  std::vector<MacroParam> params;
};

}  // namespace shardlm::jinja
