// shardlm's Jinja interpreter against jinja2 rendering as transformers renders
// chat templates (tests/fixtures/jinja_cases.json, made by
// tools/make_jinja_fixture.py): every construct Hugging Face templates use, its
// whitespace control, and the cases jinja2 refuses; then the constructs shardlm
// refuses on purpose, each a one-line error naming it and its line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hf_tokenizer_fixture.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/jinja/template.hpp"

namespace shardlm::jinja {
namespace {

using shardlm::testing::read_whole_file;

const nlohmann::ordered_json& fixture() {
  static const nlohmann::ordered_json cases =
      nlohmann::ordered_json::parse(read_whole_file(std::string(SHARDLM_FIXTURE_DIR) + "/jinja_cases.json"));
  return cases;
}

Variables fixture_variables() {
  Variables variables;
  for (const auto& [name, value] : fixture()["variables"].items()) variables.emplace_back(name, Value::from_json(value));
  variables.emplace_back("strftime_now", strftime_now_at(fixture()["strftime_now_unix_seconds"].get<int64_t>()));
  return variables;
}

std::string render(const std::string& source, const Variables& variables = {}) {
  return Template(source).render(variables);
}

// The Error `source` raises (parsing or rendering); "" when it renders.
std::string error_of(const std::string& source, const Variables& variables = {}) {
  try {
    render(source, variables);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Jinja, RendersAsJinja2Does) {
  const Variables variables = fixture_variables();
  ASSERT_GE(fixture()["cases"].size(), 40u);
  for (const auto& item : fixture()["cases"]) {
    const std::string name = item["name"];
    const std::string source = item["template"];
    if (item.contains("error")) {
      const std::string error = error_of(source, variables);
      EXPECT_EQ(error.rfind("chat template line ", 0), 0u) << name << ": " << error << " (jinja2: " << item["error"] << ")";
      EXPECT_EQ(error.find('\n'), std::string::npos) << name << ": " << error;
      continue;
    }
    std::string output;
    try {
      output = render(source, variables);
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    EXPECT_EQ(output, item["output"].get<std::string>()) << name << "\ntemplate: " << source;
  }
}

TEST(Jinja, RaiseExceptionCarriesTheMessage) {
  EXPECT_EQ(error_of("a\n{{ raise_exception('Only user and assistant roles are supported!') }}"),
            "chat template line 2: raise_exception: Only user and assistant roles are supported!");
}

TEST(Jinja, GenerationBlockRendersItsBody) {
  // transformers' {% generation %} marks assistant text for return_assistant_tokens_mask.
  EXPECT_EQ(render("a{% generation %}b{{ 1 + 1 }}{% endgeneration %}c"), "ab2c");
}

TEST(Jinja, StrftimeNowIsTheGivenTime) {
  const Variables at = {{"strftime_now", strftime_now_at(1721952000)}};  // 2024-07-26 00:00:00 UTC
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}", at), "26 Jul 2024");
}

TEST(Jinja, UnsupportedConstructsAreOneLineErrorsNamingThem) {
  const Variables variables = {{"xs", Value(Array{Value(1)})}, {"s", Value("é")}};
  const std::pair<const char*, const char*> cases[] = {
      {"x\n{% include 'other.jinja' %}", "chat template line 2: the {% include %} statement is not supported"},
      {"{% extends 'base' %}", "chat template line 1: the {% extends %} statement is not supported"},
      {"{% raw %}{{ x }}{% endraw %}", "chat template line 1: the {% raw %} statement is not supported"},
      {"\n\n{{ xs|wordwrap }}", "chat template line 3: filter 'wordwrap' is not supported"},
      {"{{ 1 is prime }}", "chat template line 1: test 'prime' is not supported"},
      {"{{ 'abc'.zfill(5) }}", "chat template line 1: method 'zfill' is undefined"},
      {"{{ '%s!' % 'hi' }}", "chat template line 1: string % formatting is not supported"},
      {"{{ s|upper }}", "chat template line 1: filter 'upper' of non-ASCII text is not supported"},
      {"{% for x in xs recursive %}{% endfor %}", "chat template line 1: recursive for loops are not supported"},
      {"{{ 1 < 2 < 3 }}", "chat template line 1: chained comparisons (a < b < c) are not supported"},
      {"{{ f(*xs) }}", "chat template line 1: *args and **kwargs in calls are not supported"},
      {"{% if true %}\nopen", "chat template line 1: block opened here is never closed (expected {% endif %})"},
      {"{{ 1 + }}", "chat template line 1: expected a value, found '}}'"},
      {"{{ 'open", "chat template line 1: unterminated string literal"},
      {"{# never closed", "chat template line 1: unterminated comment (expected #})"},
      {"{% set d = {} %}{% set d.x = 1 %}", "chat template line 1: cannot set attribute 'x' of 'd' (dict)"},
      {"{{ xs.append(2) }}", "chat template line 1: method 'append' is undefined"},
  };
  for (const auto& [source, expected] : cases) {
    const std::string error = error_of(source, variables);
    EXPECT_EQ(error.rfind(expected, 0), 0u) << "template: " << source << "\nerror: " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

TEST(Jinja, ValuesPrintAndCompareAsPython) {
  EXPECT_EQ(Value(1.0).str(), "1.0");
  EXPECT_EQ(Value(0.1).str(), "0.1");
  EXPECT_EQ(Value::none().str(), "None");
  EXPECT_EQ(Value(true).str(), "True");
  EXPECT_EQ(Value(Array{Value("a'b"), Value(int64_t{2})}).str(), "[\"a'b\", 2]");
  EXPECT_EQ(Value::tuple(Array{Value("x")}).repr(), "('x',)");
  EXPECT_TRUE(equal(Value(true), Value(int64_t{1})));
  EXPECT_TRUE(equal(Value(int64_t{2}), Value(2.0)));
  EXPECT_FALSE(equal(Value("1"), Value(int64_t{1})));
  EXPECT_FALSE(less(Value("a"), Value(int64_t{1})).has_value());
  EXPECT_EQ(code_points("a\xc3\xa9\xff").size(), 3u);  // a, é, one invalid byte
  EXPECT_EQ(to_json(Value::from_json(nlohmann::ordered_json::parse(R"({"b": [1, 2.5], "a": "é"})")), std::nullopt),
            R"({"b": [1, 2.5], "a": "é"})");
}

}  // namespace
}  // namespace shardlm::jinja
