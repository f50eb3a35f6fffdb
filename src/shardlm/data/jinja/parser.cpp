#include "shardlm/data/jinja/parser.hpp"

#include <algorithm>
#include <initializer_list>

#include <fmt/format.h>

#include "shardlm/core/error.hpp"

namespace shardlm::jinja {
namespace {

using K = Token::Kind;

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error(fmt::format("chat template line {}: {}", line, what));
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case K::text: return "template text";
    case K::variable_begin: return "'{{'";
    case K::variable_end: return "'}}'";
    case K::block_begin: return "'{%'";
    case K::block_end: return "'%}'";
    case K::string: return "a string";
    case K::integer:
    case K::floating: return "number " + t.value;
    case K::end: return "the end of the template";
    default: return "'" + t.value + "'";
  }
}

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_template() {
    std::string ended_by;
    Body body = parse_body({}, ended_by);
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).kind == K::op && peek(ahead).value == op; }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == K::name && peek(ahead).value == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek().line, fmt::format("expected '{}', found {}", op, describe(peek())));
  }
  void expect_kind(K kind, const char* what) {
    if (peek().kind != kind) fail(peek().line, fmt::format("expected {}, found {}", what, describe(peek())));
    next();
  }
  std::string expect_identifier(const char* what) {
    if (peek().kind != K::name) fail(peek().line, fmt::format("expected {}, found {}", what, describe(peek())));
    return next().value;
  }
  void expect_block_end() { expect_kind(K::block_end, "'%}'"); }

  // Statements until a block tag whose keyword is in `ends` (consumed up to
  // the keyword; `ended_by` says which). Top level: `ends` empty, until the end.
  Body parse_body(std::initializer_list<const char*> ends, std::string& ended_by, int opened_at = 0) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == K::end) {
        if (ends.size() == 0) return body;
        fail(opened_at, fmt::format("block opened here is never closed (expected {{% {} %}})", *(ends.end() - 1)));
      }
      if (t.kind == K::text) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::text;
        node->line = t.line;
        node->text = next().value;
        body.push_back(std::move(node));
        continue;
      }
      if (t.kind == K::variable_begin) {
        next();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::output;
        node->line = t.line;
        node->expr = parse_expression();
        expect_kind(K::variable_end, "'}}'");
        body.push_back(std::move(node));
        continue;
      }
      if (t.kind != K::block_begin) fail(t.line, fmt::format("unexpected {}", describe(t)));
      const Token& keyword = peek(1);
      if (keyword.kind != K::name) fail(keyword.line, fmt::format("expected a statement after '{{%', found {}", describe(keyword)));
      for (const char* end : ends)
        if (keyword.value == end) {
          next();
          next();
          ended_by = end;
          return body;
        }
      next();
      body.push_back(parse_statement());
    }
  }

  NodePtr parse_statement() {
    const Token& keyword = next();
    const std::string& k = keyword.value;
    auto node = std::make_unique<Node>();
    node->line = keyword.line;
    std::string ended_by;
    if (k == "if") {
      node->kind = Node::Kind::if_chain;
      ExprPtr condition = parse_expression();
      while (true) {
        expect_block_end();
        Body body = parse_body({"elif", "else", "endif"}, ended_by, node->line);
        node->branches.emplace_back(std::move(condition), std::move(body));
        if (ended_by == "elif") {
          condition = parse_expression();
          continue;
        }
        if (ended_by == "else") {
          expect_block_end();
          node->branches.emplace_back(nullptr, parse_body({"endif"}, ended_by, node->line));
        }
        break;
      }
    } else if (k == "for") {
      node->kind = Node::Kind::for_loop;
      node->targets.push_back(expect_identifier("a loop variable"));
      while (accept_op(",")) node->targets.push_back(expect_identifier("a loop variable"));
      if (!accept_name("in")) fail(peek().line, fmt::format("expected 'in' in the for loop, found {}", describe(peek())));
      node->expr = parse_or_tuple(/*with_conditional=*/false);
      if (accept_name("if")) node->condition = parse_expression();
      if (is_name("recursive")) fail(peek().line, "recursive for loops are not supported");
      expect_block_end();
      node->body = parse_body({"else", "endfor"}, ended_by, node->line);
      if (ended_by == "else") {
        expect_block_end();
        node->else_body = parse_body({"endfor"}, ended_by, node->line);
      }
    } else if (k == "set") {
      node->targets.push_back(expect_identifier("a variable name"));
      if (accept_op(".")) {
        node->attribute = expect_identifier("an attribute name");
      } else {
        while (accept_op(",")) node->targets.push_back(expect_identifier("a variable name"));
      }
      if (accept_op("=")) {
        node->kind = Node::Kind::set;
        node->expr = parse_or_tuple(/*with_conditional=*/true);
      } else {
        if (node->targets.size() != 1 || !node->attribute.empty())
          fail(node->line, "a block set ({% set x %}...{% endset %}) assigns one plain variable");
        if (is_op("|")) fail(peek().line, "filters on a block set are not supported");
        node->kind = Node::Kind::set_block;
        expect_block_end();
        node->body = parse_body({"endset"}, ended_by, node->line);
      }
    } else if (k == "macro") {
      node->kind = Node::Kind::macro;
      node->name = expect_identifier("a macro name");
      node->params = parse_params();
      expect_block_end();
      node->body = parse_body({"endmacro"}, ended_by, node->line);
    } else if (k == "call") {
      node->kind = Node::Kind::call_block;
      if (is_op("(")) node->params = parse_params();
      node->expr = parse_expression();
      if (node->expr->kind != Expr::Kind::call) fail(node->line, "{% call %} needs a macro call");
      expect_block_end();
      node->body = parse_body({"endcall"}, ended_by, node->line);
    } else if (k == "filter") {
      node->kind = Node::Kind::filter_block;
      // The filter chain applied to a placeholder literal holding the body's text.
      ExprPtr placeholder = make(Expr::Kind::name, node->line);
      placeholder->name = kFilterBlockInput;
      node->expr = parse_filters(std::move(placeholder), /*first_pipe_done=*/true);
      expect_block_end();
      node->body = parse_body({"endfilter"}, ended_by, node->line);
    } else if (k == "break" || k == "continue") {
      node->kind = k == "break" ? Node::Kind::loop_break : Node::Kind::loop_continue;
    } else if (k == "generation") {
      node->kind = Node::Kind::generation;
      expect_block_end();
      node->body = parse_body({"endgeneration"}, ended_by, node->line);
    } else {
      fail(keyword.line, fmt::format("the {{% {} %}} statement is not supported by shardlm's template interpreter", k));
    }
    // The "%}" of the statement itself, or of its end tag for a compound one.
    expect_block_end();
    return node;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!accept_op(")")) {
      if (!params.empty()) expect_op(",");
      if (accept_op(")")) break;
      MacroParam param;
      param.name = expect_identifier("a parameter name");
      if (accept_op("=")) param.default_value = parse_expression();
      params.push_back(std::move(param));
    }
    return params;
  }

  // An expression, or several separated by commas (a tuple), as set and for take.
  ExprPtr parse_or_tuple(bool with_conditional) {
    const int line = peek().line;
    ExprPtr first = with_conditional ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::tuple, line);
    tuple->items.push_back(std::move(first));
    while (accept_op(",")) tuple->items.push_back(with_conditional ? parse_expression() : parse_or());
    return tuple;
  }

  ExprPtr parse_expression() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto cond = make(Expr::Kind::conditional, line);
      cond->a = parse_or();
      cond->b = std::move(expr);
      if (accept_name("else")) cond->c = parse_expression();
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(Expr::Kind kind, ExprPtr a, ExprPtr b, std::string name, int line) {
    auto e = make(kind, line);
    e->a = std::move(a);
    e->b = std::move(b);
    e->name = std::move(name);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      left = binary(Expr::Kind::logical_or, std::move(left), parse_and(), "or", line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      left = binary(Expr::Kind::logical_and, std::move(left), parse_not(), "and", line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = make(Expr::Kind::logical_not, next().line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    bool compared = false;
    while (true) {
      const int line = peek().line;
      std::string op;
      bool negated = false;
      if (peek().kind == K::op && (peek().value == "==" || peek().value == "!=" || peek().value == "<" ||
                                   peek().value == "<=" || peek().value == ">" || peek().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "in";
        negated = true;
      } else {
        return left;
      }
      if (compared) fail(line, "chained comparisons (a < b < c) are not supported");
      compared = true;
      left = binary(Expr::Kind::compare, std::move(left), parse_math1(), op, line);
      left->negated = negated;
    }
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      left = binary(Expr::Kind::binary, std::move(left), parse_concat(), op.value, op.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      left = binary(Expr::Kind::binary, std::move(left), parse_math2(), "~", line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      left = binary(Expr::Kind::binary, std::move(left), parse_pow(), op.value, op.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = binary(Expr::Kind::binary, std::move(left), parse_unary(true), "**", line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filters) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      node = make(op.value == "-" ? Expr::Kind::negate : Expr::Kind::plus, op.line);
      node->a = parse_unary(false);
    } else {
      node = parse_postfix(parse_primary());
    }
    if (!with_filters) return node;
    return parse_filters(std::move(node), false);
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    if (t.kind == K::name) {
      if (t.value == "true" || t.value == "True") return literal(Value(true), t.line);
      if (t.value == "false" || t.value == "False") return literal(Value(false), t.line);
      if (t.value == "none" || t.value == "None") return literal(Value::none(), t.line);
      auto e = make(Expr::Kind::name, t.line);
      e->name = t.value;
      return e;
    }
    if (t.kind == K::string) {
      std::string text = t.value;
      while (peek().kind == K::string) text += next().value;
      return literal(Value(std::move(text)), t.line);
    }
    if (t.kind == K::integer) {
      try {
        return literal(Value(static_cast<int64_t>(std::stoll(t.value))), t.line);
      } catch (const std::exception&) {
        fail(t.line, fmt::format("integer {} is out of range", t.value));
      }
    }
    if (t.kind == K::floating) return literal(Value(std::stod(t.value)), t.line);
    if (t.kind == K::op && t.value == "(") {
      if (accept_op(")")) return make(Expr::Kind::tuple, t.line);
      ExprPtr first = parse_expression();
      if (!is_op(",")) {
        expect_op(")");
        return first;
      }
      auto tuple = make(Expr::Kind::tuple, t.line);
      tuple->items.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op(")")) break;
        tuple->items.push_back(parse_expression());
      }
      expect_op(")");
      return tuple;
    }
    if (t.kind == K::op && t.value == "[") {
      auto list = make(Expr::Kind::list, t.line);
      while (!accept_op("]")) {
        if (!list->items.empty()) {
          expect_op(",");
          if (accept_op("]")) break;
        }
        list->items.push_back(parse_expression());
      }
      return list;
    }
    if (t.kind == K::op && t.value == "{") {
      auto dict = make(Expr::Kind::dict, t.line);
      while (!accept_op("}")) {
        if (!dict->items.empty()) {
          expect_op(",");
          if (accept_op("}")) break;
        }
        dict->items.push_back(parse_expression());
        expect_op(":");
        dict->items.push_back(parse_expression());
      }
      return dict;
    }
    fail(t.line, fmt::format("expected a value, found {}", describe(t)));
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(Expr::Kind::literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (peek().kind == K::integer) {
          auto e = make(Expr::Kind::subscript, line);
          e->a = std::move(node);
          e->b = literal(Value(static_cast<int64_t>(std::stoll(next().value))), line);
          node = std::move(e);
          continue;
        }
        auto e = make(Expr::Kind::attribute, line);
        e->a = std::move(node);
        e->name = expect_identifier("an attribute name after '.'");
        node = std::move(e);
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node), Expr::Kind::call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = next().line;  // [
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (accept_op(":")) {
        is_slice = true;
        if (++part > 2) fail(line, "a slice has at most three parts");
        continue;
      }
      if (parts[part]) fail(peek().line, fmt::format("expected ']' or ':', found {}", describe(peek())));
      parts[part] = parse_expression();
    }
    next();
    if (!is_slice) {
      if (!parts[0]) fail(line, "empty subscript []");
      auto e = make(Expr::Kind::subscript, line);
      e->a = std::move(node);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = make(Expr::Kind::slice, line);
    e->a = std::move(node);
    e->items.push_back(std::move(parts[0]));
    e->items.push_back(std::move(parts[1]));
    e->items.push_back(std::move(parts[2]));
    return e;
  }

  // `callee(args)` (kind call) or filter/test arguments into `node`.
  ExprPtr parse_call(ExprPtr callee, Expr::Kind kind) {
    auto e = make(kind, peek().line);
    e->a = std::move(callee);
    parse_arguments(*e);
    return e;
  }

  void parse_arguments(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail(peek().line, "*args and **kwargs in calls are not supported");
      if (peek().kind == K::name && is_op("=", 1)) {
        std::string key = next().value;
        next();
        e.keywords.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.keywords.empty()) fail(peek().line, "a positional argument follows a keyword argument");
        e.items.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_filters(ExprPtr node, bool first_pipe_done) {
    bool pipe = first_pipe_done;
    while (true) {
      if (pipe || is_op("|")) {
        if (!pipe) next();
        pipe = false;
        auto e = make(Expr::Kind::filter, peek().line);
        e->name = expect_identifier("a filter name after '|'");
        e->a = std::move(node);
        if (is_op("(")) parse_arguments(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        const int line = next().line;
        auto e = make(Expr::Kind::test, line);
        e->negated = accept_name("not");
        // "none", "true" and "false" are test names here, not literals.
        e->name = expect_identifier("a test name after 'is'");
        e->a = std::move(node);
        if (is_op("(")) {
          parse_arguments(*e);
        } else {
          const Token& t = peek();
          const bool starts_value = t.kind == K::name || t.kind == K::string || t.kind == K::integer ||
                                    t.kind == K::floating || (t.kind == K::op && (t.value == "[" || t.value == "{"));
          if (starts_value && !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is"))
            e->items.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace shardlm::jinja
