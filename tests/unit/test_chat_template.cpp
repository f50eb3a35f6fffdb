// Chat templates against transformers' apply_chat_template with the models'
// PUBLISHED templates (tests/fixtures/chat_template_cases.json, made by
// tools/make_chat_template_fixture.py; the templates and where they came from in
// tools/chat_templates/): Qwen2.5-Instruct, Qwen3 (thinking, enable_thinking
// false and true, reasoning_content), Meta-Llama-3, Llama 3.1 and 3.2 Instruct,
// SmolLM2-Instruct and shardlm's plain template, on conversations with and
// without system turns, multi-turn, empty contents, white space, NFD text and
// special-token text. Ids must be identical and the loss masks too: the
// fixture's masks come from the same rendering rule implemented in Python on
// transformers' renders (docs/sft.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "hf_tokenizer_fixture.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/chat_template.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;
using testing::hf_tokenizer_dir;
using testing::read_whole_file;

const nlohmann::json& fixture() {
  static const nlohmann::json cases =
      nlohmann::json::parse(read_whole_file(std::string(SHARDLM_FIXTURE_DIR) + "/chat_template_cases.json"));
  return cases;
}

std::string template_file(const std::string& name) {
  return (fs::path(SHARDLM_FIXTURE_DIR) / ".." / ".." / "tools" / "chat_templates" / name).lexically_normal().string();
}

const Tokenizer& tokenizer(const std::string& kind) { return testing::hf_tokenizer(kind); }

Conversation conversation_of(const nlohmann::json& messages) {
  return conversation_from_json({{"messages", messages}}, "fixture");
}

ChatTemplateOptions options_of(const nlohmann::json& set) {
  ChatTemplateOptions options;
  options.date = fixture()["date"];
  if (set["kwargs"].contains("enable_thinking")) options.enable_thinking = set["kwargs"]["enable_thinking"].get<bool>();
  return options;
}

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("shardlm_chat_template_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

class PublishedTemplates : public ::testing::TestWithParam<std::string> {};

TEST_P(PublishedTemplates, IdsAndTargetsMatchApplyChatTemplate) {
  const auto& set = fixture()["sets"][GetParam()];
  const Tokenizer& tok = tokenizer(set["tokenizer"]);
  const ChatTemplateOptions options = options_of(set);
  // The tokenizer directory's own template, or the published file given as --template.
  const std::string choice = set["template_file"].is_null() ? "" : template_file(set["template_file"]);
  const ChatFormat format = resolve_chat_format(choice, tok, options);
  ASSERT_EQ(format.source(), set["template"].get<std::string>());
  const std::string sha = sha256_hex(format.source().data(), format.source().size());
  EXPECT_EQ(format.id().rfind("sha256:" + sha, 0), 0u) << format.id();
  ASSERT_GE(set["cases"].size(), 10u);
  int identical_ids = 0, identical_targets = 0;
  for (const auto& item : set["cases"]) {
    const std::string name = item["name"];
    const TokenizedChat chat = tokenize_chat(tok, format, conversation_of(item["messages"]));
    const bool ids_equal = chat.ids == item["ids"].get<std::vector<int32_t>>();
    const bool targets_equal = chat.targets == item["targets"].get<std::vector<uint8_t>>();
    identical_ids += ids_equal;
    identical_targets += ids_equal && targets_equal;
    EXPECT_TRUE(ids_equal) << name << "\nrendered: " << chat.text << "\nexpected: " << item["text"].get<std::string>();
    EXPECT_TRUE(targets_equal) << name;
    EXPECT_EQ(chat.text, tok.normalize(item["text"].get<std::string>())) << name;
  }
  std::cout << "[ template ] " << GetParam() << ": ids identical " << identical_ids << "/" << set["cases"].size()
            << ", ids and masks identical " << identical_targets << "/" << set["cases"].size() << "\n";
  // A built-in with this source renders the same.
  if (!set["builtin"].is_null()) {
    const ChatFormat builtin = builtin_chat_format(parse_chat_template(set["builtin"].get<std::string>()), tok,
                                                   hf_tokenizer_dir(set["tokenizer"]), options);
    EXPECT_EQ(builtin.source(), format.source());
    for (const auto& item : set["cases"])
      EXPECT_EQ(tokenize_chat(tok, builtin, conversation_of(item["messages"])).ids, item["ids"].get<std::vector<int32_t>>())
          << item["name"];
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PublishedTemplates,
                         ::testing::Values("qwen2.5-instruct", "qwen3-thinking", "qwen3-no-thinking",
                                           "qwen3-thinking-explicit", "llama3-instruct", "llama3.1-instruct",
                                           "llama3.2-instruct", "smollm2-instruct", "plain"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(ChatTemplate, BuiltinsAreThePublishedFiles) {
  const std::pair<ChatTemplate, const char*> builtins[] = {{ChatTemplate::chatml, "qwen2.5-instruct.jinja"},
                                                           {ChatTemplate::llama3, "llama3-instruct.jinja"},
                                                           {ChatTemplate::plain, "plain.jinja"},
                                                           {ChatTemplate::qwen3, "qwen3.jinja"}};
  for (const auto& [builtin, file] : builtins) {
    const ChatFormat format = builtin_chat_format(builtin, tokenizer(builtin == ChatTemplate::llama3 ? "llama3" : builtin == ChatTemplate::plain ? "gpt2" : "qwen3"), "", {});
    EXPECT_EQ(format.source(), read_whole_file(template_file(file))) << file;
    EXPECT_EQ(format.id(), std::string(chat_template_name(builtin)));
  }
}

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

TEST(ChatTemplate, Qwen3TrainsTheThinkBlockOfTheLastTurnOnly) {
  const Tokenizer& qwen3 = tokenizer("qwen3");
  const ChatFormat format = resolve_chat_format("", qwen3, {});
  const Conversation chat = conversation_of(
      {{{"role", "user"}, {"content", "A?"}},
       {{"role", "assistant"}, {"content", "a"}, {"reasoning_content", "first thought"}},
       {{"role", "user"}, {"content", "B?"}},
       {{"role", "assistant"}, {"content", "b"}, {"reasoning_content", "second thought"}}});
  const TokenizedChat out = tokenize_chat(qwen3, format, chat);
  // The earlier turn's reasoning is dropped from the text (as the template does); its answer is trained.
  EXPECT_EQ(out.text.find("first thought"), std::string::npos);
  std::string trained;
  for (size_t i = 0; i < out.ids.size(); ++i)
    if (out.targets[i]) trained += qwen3.decode(std::span<const int32_t>(&out.ids[i], 1));
  EXPECT_EQ(trained, "a<|im_end|><think>\nsecond thought\n</think>\n\nb<|im_end|>");
}

TEST(ChatTemplate, RefusesDataTheTemplateCannotExpress) {
  const Conversation reasoning = conversation_of(
      {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}, {"reasoning_content", "r"}}});
  try {
    tokenize_chat(tokenizer("qwen2"), ChatTemplate::chatml, reasoning);
    ADD_FAILURE() << "reasoning_content rendered by a template without a think block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has reasoning_content, which chat template chatml never renders"),
              std::string::npos) << e.what();
  }
  ChatTemplateOptions no_thinking;
  no_thinking.enable_thinking = false;
  const ChatFormat qwen3 = builtin_chat_format(ChatTemplate::qwen3, tokenizer("qwen3"), "", no_thinking);
  EXPECT_EQ(qwen3.id(), "qwen3,enable_thinking=false");
  try {
    tokenize_chat(tokenizer("qwen3"), qwen3, reasoning);
    ADD_FAILURE() << "reasoning with an empty think block in the prompt";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("assistant message 1: the conversation ending with this turn does not start "
                                         "with the generation prompt"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, TemplateOfTheDirectory) {
  // tokenizer_config.json's list form takes "default"; chat_template.jinja beside it wins.
  const std::string dir = fresh_dir("dir");
  fs::copy_file(fs::path(hf_tokenizer_dir("gpt2")) / "tokenizer.json", fs::path(dir) / "tokenizer.json");
  nlohmann::json config = nlohmann::json::parse(read_whole_file(fs::path(hf_tokenizer_dir("gpt2")) / "tokenizer_config.json"));
  config["chat_template"] = nlohmann::json::array({{{"name", "tool_use"}, {"template", "T{{ messages|length }}"}},
                                                   {{"name", "default"}, {"template", "D{{ eos_token }}"}}});
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << config.dump();
  const auto tok = make_tokenizer("hf:" + dir);
  const Conversation chat = conversation_of({{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}}});
  EXPECT_EQ(resolve_chat_format("", *tok, {}).render(chat.messages, 2, false), "D<|endoftext|>");
  std::ofstream(fs::path(dir) / "chat_template.jinja") << "J{{ messages[1].content }}";
  const auto tok2 = make_tokenizer("hf:" + dir);
  const ChatFormat jinja_file = resolve_chat_format("", *tok2, {});
  EXPECT_EQ(jinja_file.render(chat.messages, 2, false), "Ja");
  EXPECT_EQ(jinja_file.id(), "sha256:" + sha256_hex("J{{ messages[1].content }}", 26));
  fs::remove(fs::path(dir) / "chat_template.jinja");
  config["chat_template"] = nlohmann::json::array({{{"name", "tool_use"}, {"template", "T"}}});
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << config.dump();
  const auto tok3 = make_tokenizer("hf:" + dir);
  EXPECT_THROW(resolve_chat_format("", *tok3, {}), Error);
  fs::remove_all(dir);
}

TEST(ChatTemplate, NamesAndErrors) {
  EXPECT_EQ(parse_chat_template("llama3"), ChatTemplate::llama3);
  EXPECT_EQ(parse_chat_template("qwen3"), ChatTemplate::qwen3);
  try {
    parse_chat_template("vicuna");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown chat template 'vicuna' (expected chatml, llama3, plain, qwen3 or a "
                                         ".jinja file)"), std::string::npos);
  }
  // GPT-2 has no <|im_start|>: chatml is refused by name; byte has no end-of-text for plain.
  const Conversation chat = conversation_of({{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}}});
  EXPECT_THROW(tokenize_chat(tokenizer("gpt2"), ChatTemplate::chatml, chat), Error);
  const auto byte = make_tokenizer("byte");
  EXPECT_EQ(default_chat_template(*byte), ChatTemplate::plain);
  EXPECT_THROW(tokenize_chat(*byte, ChatTemplate::plain, chat), Error);
  EXPECT_THROW(resolve_chat_format("/nonexistent/x.jinja", *byte, {}), Error);
  ChatTemplateOptions bad_date;
  bad_date.date = "26 Jul 2024";
  EXPECT_THROW(builtin_chat_format(ChatTemplate::chatml, tokenizer("qwen2"), "", bad_date), Error);
  // A template with a syntax error names its origin and line.
  const std::string dir = fresh_dir("bad");
  std::ofstream(fs::path(dir) / "bad.jinja") << "ok\n{% if %}";
  try {
    resolve_chat_format(dir + "/bad.jinja", tokenizer("qwen2"), {});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir + "/bad.jinja: chat template line 2: expected a value, found '%}'");
  }
  fs::remove_all(dir);
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
