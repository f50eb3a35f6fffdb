// Chat templates against transformers' apply_chat_template with the models' real
// templates (tests/fixtures/chat_template_cases.json, made by
// tools/make_chat_template_fixture.py): Qwen2.5's (chatml), Meta-Llama-3's (llama3)
// and shardlm's plain one written as Jinja, on conversations with and without a
// system turn, multi-turn, empty contents, white space, NFD text and special-token
// text; the targets there are computed from the fast tokenizer's offsets.
#include <gtest/gtest.h>

#include "hf_tokenizer_fixture.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/chat_template.hpp"

namespace shardlm {
namespace {

using testing::hf_tokenizer_dir;
using testing::read_whole_file;

const nlohmann::json& fixture() {
  static const nlohmann::json cases =
      nlohmann::json::parse(read_whole_file(std::string(SHARDLM_FIXTURE_DIR) + "/chat_template_cases.json"));
  return cases;
}

const Tokenizer& tokenizer(const std::string& kind) { return testing::hf_tokenizer(kind); }

Conversation conversation_of(const nlohmann::json& messages) {
  return conversation_from_json({{"messages", messages}}, "fixture");
}

class ChatTemplateKinds : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateKinds, IdsAndTargetsMatchApplyChatTemplate) {
  const auto& kind = fixture()["kinds"][GetParam()];
  const Tokenizer& tok = tokenizer(GetParam());
  const ChatTemplate chat_template = parse_chat_template(kind["template"].get<std::string>());
  EXPECT_EQ(default_chat_template(tok), chat_template);
  ASSERT_GE(kind["cases"].size(), 11u);
  for (const auto& item : kind["cases"]) {
    const TokenizedChat chat = tokenize_chat(tok, chat_template, conversation_of(item["messages"]));
    const std::string name = item["name"];
    EXPECT_EQ(chat.ids, item["ids"].get<std::vector<int32_t>>()) << name << "\nrendered: " << chat.text
                                                                   << "\nexpected: " << item["text"].get<std::string>();
    EXPECT_EQ(chat.targets, item["targets"].get<std::vector<uint8_t>>()) << name;
    EXPECT_EQ(chat.text, tok.normalize(item["text"].get<std::string>())) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ChatTemplateKinds, ::testing::Values("qwen2", "llama3", "gpt2"));

TEST(ChatTemplate, TargetsAreAssistantContentAndEndOfTurnOnly) {
  const Tokenizer& qwen = tokenizer("qwen2");
  const Conversation chat = conversation_of(
      {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "hello there"}}});
  const TokenizedChat out = tokenize_chat(qwen, ChatTemplate::chatml, chat);
  // ... <|im_start|>assistant\n hello there <|im_end|> \n: targets are "hello", " there", <|im_end|>.
  ASSERT_GE(out.ids.size(), 5u);
  const size_t n = out.ids.size();
  EXPECT_EQ(out.ids[n - 2], 151645);
  EXPECT_EQ(out.ids[n - 1], 198);  // "\n" after <|im_end|>: not trained on
  const std::vector<uint8_t> tail(out.targets.end() - 6, out.targets.end());
  EXPECT_EQ(tail, (std::vector<uint8_t>{0, 0, 1, 1, 1, 0}));  // assistant, \n, hello, there, <|im_end|>, \n
  int targets = 0;
  for (uint8_t t : out.targets) targets += t;
  EXPECT_EQ(targets, 3);
}

TEST(ChatTemplate, NamesAndErrors) {
  EXPECT_EQ(parse_chat_template("llama3"), ChatTemplate::llama3);
  try {
    parse_chat_template("vicuna");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown chat template 'vicuna' (expected chatml, llama3 or plain)"),
              std::string::npos);
  }
  // GPT-2 has no <|im_start|>: chatml is refused by name; byte has no end-of-text for plain.
  const Conversation chat = conversation_of({{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}}});
  EXPECT_THROW(tokenize_chat(tokenizer("gpt2"), ChatTemplate::chatml, chat), Error);
  const auto byte = make_tokenizer("byte");
  EXPECT_EQ(default_chat_template(*byte), ChatTemplate::plain);
  EXPECT_THROW(tokenize_chat(*byte, ChatTemplate::plain, chat), Error);
}

TEST(ChatTemplate, PythonStripRemovesUnicodeSpace) {
  EXPECT_EQ(python_strip("  \t\n x y \r\n"), "x y");
  EXPECT_EQ(python_strip("\xe3\x80\x80" "a" "\xc2\xa0\xe2\x80\xa8"), "a");  // U+3000, U+00A0, U+2028
  EXPECT_EQ(python_strip("\x1c" "a" "\x1f"), "a");
  EXPECT_EQ(python_strip("\xe2\x80\x8b" "a"), "\xe2\x80\x8b" "a");  // U+200B is not white space in Python
  EXPECT_EQ(python_strip(" \n "), "");
  EXPECT_EQ(python_strip(" \xff "), "\xff");
}

}  // namespace
}  // namespace shardlm
