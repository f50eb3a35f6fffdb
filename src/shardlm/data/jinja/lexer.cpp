#include "shardlm/data/jinja/lexer.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "shardlm/core/error.hpp"
#include "shardlm/data/utf8.hpp"

namespace shardlm::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error(fmt::format("chat template line {}: {}", line, what));
}

int count_newlines(std::string_view text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

// Python's "unicode-escape" decoding of a string literal's body, as Jinja does.
std::string unescape(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](size_t digits) {
      const std::string text(i + digits < body.size() ? body.substr(i + 1, digits) : std::string_view());
      if (text.size() != digits || !std::all_of(text.begin(), text.end(), [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); }))
        fail(line, fmt::format("bad \\{} escape in a string", c));
      i += digits;
      return static_cast<char32_t>(std::stoul(text, nullptr, 16));
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '0': out += '\0'; break;
      case '\n': break;  // line continuation
      case 'x': utf8::append(out, hex(2)); break;
      case 'u': utf8::append(out, hex(4)); break;
      case 'U': utf8::append(out, hex(8)); break;
      default:  // Python keeps unknown escapes as written
        out += '\\';
        out += c;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : src_(source), options_(options) {}

  std::vector<Token> run() {
    bool strip_leading = false;  // the previous tag ended with "-"
    bool line_starting = true;   // the text to come starts a line
    while (pos_ < src_.size()) {
      size_t at = pos_;
      while (true) {
        at = src_.find('{', at);
        if (at == std::string_view::npos || at + 1 >= src_.size()) {
          at = std::string_view::npos;
          break;
        }
        const char next = src_[at + 1];
        if (next == '{' || next == '%' || next == '#') break;
        ++at;
      }
      std::string text(src_.substr(pos_, at == std::string_view::npos ? std::string_view::npos : at - pos_));
      const int text_line = line_;
      line_ += count_newlines(text);
      if (strip_leading) {
        size_t first = 0;
        while (first < text.size() && is_space(text[first])) ++first;
        text.erase(0, first);
      }
      if (at == std::string_view::npos) {
        emit_text(std::move(text), text_line);
        break;
      }
      const char kind = src_[at + 1];
      const char marker = at + 2 < src_.size() ? src_[at + 2] : '\0';
      if (marker == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (marker != '+' && options_.lstrip_blocks && kind != '{') {
        const size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        const bool only_blanks = std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_begin), text.end(),
                                             [](char c) { return c == ' ' || c == '\t'; });
        if ((line_begin > 0 || line_starting) && only_blanks) text.erase(line_begin);
      }
      emit_text(std::move(text), text_line);
      pos_ = at + 2 + ((marker == '-' || marker == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == std::string_view::npos) fail(line_, "unterminated comment (expected #})");
        line_ += count_newlines(src_.substr(pos_, end - pos_));
        strip_leading = end > pos_ && src_[end - 1] == '-';
        const bool keep = end > pos_ && src_[end - 1] == '+';
        pos_ = end + 2;
        line_starting = trim_newline(!strip_leading && !keep);
        continue;
      }
      const bool block = kind == '%';
      tokens_.push_back({block ? Token::Kind::block_begin : Token::Kind::variable_begin, "", line_});
      const char close = block ? '%' : '}';
      const char end_marker = lex_expression(close);
      tokens_.push_back({block ? Token::Kind::block_end : Token::Kind::variable_end, "", line_});
      strip_leading = end_marker == '-';
      line_starting = block ? trim_newline(end_marker == '\0') : false;
    }
    tokens_.push_back({Token::Kind::end, "", line_});
    return std::move(tokens_);
  }

 private:
  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({Token::Kind::text, std::move(text), line});
  }

  // trim_blocks: the newline right after a block or comment tag goes. Returns
  // whether the text to come starts a line.
  bool trim_newline(bool allowed) {
    if (allowed && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      return true;
    }
    return false;
  }

  bool at_close(char close, size_t p) const { return p + 1 < src_.size() && src_[p] == close && src_[p + 1] == '}'; }

  // Tokens up to the tag's end; returns its marker ('-', '+' or '\0').
  char lex_expression(char close) {
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) fail(line_, fmt::format("unterminated tag (expected {}}})", close));
      if ((src_[pos_] == '-' || src_[pos_] == '+') && at_close(close, pos_ + 1)) {
        const char marker = src_[pos_];
        pos_ += 3;
        return marker;
      }
      if (at_close(close, pos_)) {
        pos_ += 2;
        return '\0';
      }
      lex_one();
    }
  }

  void lex_one() {
    const char c = src_[pos_];
    const int line = line_;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t begin = pos_;
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      tokens_.push_back({Token::Kind::name, std::string(src_.substr(begin, pos_ - begin)), line});
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      const size_t begin = pos_;
      bool floating = false;
      auto digits = [&] {
        while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      };
      digits();
      if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
        floating = true;
        ++pos_;
        digits();
      }
      if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
        size_t p = pos_ + 1;
        if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
        if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
          floating = true;
          pos_ = p;
          digits();
        }
      }
      std::string text(src_.substr(begin, pos_ - begin));
      text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
      tokens_.push_back({floating ? Token::Kind::floating : Token::Kind::integer, std::move(text), line});
      return;
    }
    if (c == '\'' || c == '"') {
      size_t p = pos_ + 1;
      while (p < src_.size() && src_[p] != c) p += src_[p] == '\\' ? 2 : 1;
      if (p >= src_.size()) fail(line, "unterminated string literal");
      const std::string_view body = src_.substr(pos_ + 1, p - pos_ - 1);
      line_ += count_newlines(body);
      tokens_.push_back({Token::Kind::string, unescape(body, line), line});
      pos_ = p + 1;
      return;
    }
    static constexpr std::string_view kTwoCharOps[] = {"**", "//", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwoCharOps)
      if (src_.substr(pos_, 2) == op) {
        tokens_.push_back({Token::Kind::op, std::string(op), line});
        pos_ += 2;
        return;
      }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) != std::string_view::npos) {
      tokens_.push_back({Token::Kind::op, std::string(1, c), line});
      ++pos_;
      return;
    }
    fail(line, fmt::format("unexpected character '{}' in an expression", c));
  }

  std::string_view src_;
  LexerOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace shardlm::jinja
