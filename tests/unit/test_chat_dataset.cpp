// Chat datasets (JSONL): the three line forms, the real SFT files in
// ../shared/data/sft, and one-line errors naming the file and line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "shardlm/core/error.hpp"
#include "shardlm/data/chat_dataset.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

class ChatDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("shardlm_chat_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl");
  }
  void TearDown() override { fs::remove(path_); }
  std::vector<Conversation> read(const std::string& content) {
    std::ofstream(path_, std::ios::binary) << content;
    return read_chat_dataset(path_.string());
  }
  void expect_error(const std::string& content, const std::vector<std::string>& phrases) {
    try {
      read(content);
      ADD_FAILURE() << "expected an error containing '" << phrases.front() << "'";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path_.string()), std::string::npos) << message;
      for (const auto& phrase : phrases) EXPECT_NE(message.find(phrase), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  fs::path path_;
};

std::vector<std::pair<ChatRole, std::string>> turns(const Conversation& c) {
  std::vector<std::pair<ChatRole, std::string>> out;
  for (const auto& m : c.messages) out.emplace_back(m.role, m.content);
  return out;
}

TEST_F(ChatDataset, ReadsTheThreeForms) {
  using enum ChatRole;
  const auto examples = read(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": ""}]})"
      "\n\n"
      R"({"query": "Q2", "response": "R2", "system": "S2", "history": [["q0", "r0"], ["q1", "r1"]]})"
      "\r\n"
      R"({"prompt": "P", "response": "R", "system": null, "id": 7})"
      "\n"
      R"({"instruction": "I", "input": "In", "output": "O"})"
      "\n"
      R"({"instruction": "", "input": "only input", "output": "O2"})");
  ASSERT_EQ(examples.size(), 5u);
  EXPECT_EQ(turns(examples[0]), (decltype(turns(examples[0])){{system, "S"}, {user, "U"}, {assistant, ""}}));
  EXPECT_EQ(examples[0].line, 1);
  EXPECT_EQ(turns(examples[1]), (decltype(turns(examples[1])){{system, "S2"}, {user, "q0"}, {assistant, "r0"},
                                                              {user, "q1"}, {assistant, "r1"}, {user, "Q2"},
                                                              {assistant, "R2"}}));
  EXPECT_EQ(examples[1].line, 3);
  EXPECT_EQ(turns(examples[2]), (decltype(turns(examples[2])){{user, "P"}, {assistant, "R"}}));
  EXPECT_EQ(turns(examples[3]), (decltype(turns(examples[3])){{user, "I\nIn"}, {assistant, "O"}}));
  EXPECT_EQ(turns(examples[4]), (decltype(turns(examples[4])){{user, "only input"}, {assistant, "O2"}}));
}

TEST_F(ChatDataset, AssistantTurnsMayCarryReasoning) {
  const auto examples = read(
      R"({"messages": [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A", "reasoning_content": "R"}, )"
      R"({"role": "user", "content": "U2"}, {"role": "assistant", "content": "A2", "reasoning_content": null}]})");
  ASSERT_EQ(examples.size(), 1u);
  EXPECT_EQ(examples[0].messages[1].reasoning_content, std::optional<std::string>("R"));
  EXPECT_FALSE(examples[0].messages[3].reasoning_content.has_value());  // null: none, as transformers drops None keys
  EXPECT_FALSE(examples[0].messages[0].reasoning_content.has_value());
}

TEST(ChatDatasetFiles, ReadsTheSharedSftData) {
  const std::string dir = std::string(SHARDLM_SHARED_DATA_DIR) + "/sft/";
  EXPECT_EQ(read_chat_dataset(dir + "gsm8k_train.jsonl").size(), 7473u);
  EXPECT_EQ(read_chat_dataset(dir + "gsm8k_test.jsonl").size(), 1319u);
  const auto self_instruct = read_chat_dataset(dir + "self_instruct_seed_tasks.jsonl");
  ASSERT_EQ(self_instruct.size(), 175u);
  EXPECT_EQ(self_instruct[0].messages.size(), 2u);  // prompt + response win over instruction/input/output
}

TEST_F(ChatDataset, BadInputIsOneLineNamingFileAndLine) {
  const std::string ok = R"({"prompt": "p", "response": "r"})" "\n";
  expect_error(ok + "{\"prompt\": \"p\", \n", {"line 2", "malformed JSON"});
  expect_error(ok + ok + R"({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]})",
               {"line 3", "unknown role \"tool\""});
  expect_error(R"({"messages": [{"role": "user", "content": "only a question"}]})", {"line 1", "no assistant turn"});
  expect_error("\n  \n", {"has no examples"});
  expect_error("", {"has no examples"});
  expect_error(R"({"text": "plain text"})", {"line 1", "is no chat example"});
  expect_error(R"({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]})",
               {"line 1 message 0", "\"content\" is 5"});
  expect_error(R"({"messages": [{"role": "assistant", "content": "a", "tool_calls": []}]})",
               {"line 1 message 0", "\"tool_calls\" is not supported"});
  expect_error(R"({"messages": [{"role": "user", "content": "q", "reasoning_content": "r"}, {"role": "assistant", "content": "a"}]})",
               {"line 1 message 0", "\"reasoning_content\" on a user message"});
  expect_error(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": 3}]})",
               {"line 1 message 1", "\"reasoning_content\" is 3"});
  expect_error(R"({"query": "q", "response": "r", "history": [["only one"]]})", {"history entry"});
  expect_error("[1, 2]", {"line 1", "expected a JSON object"});
  fs::remove(path_);
  try {
    read_chat_dataset(path_.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
}

}  // namespace
}  // namespace shardlm
