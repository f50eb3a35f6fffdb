// prepare --sft: examples rendered, tokenized and masked as tokenize_chat does
// (checked against apply_chat_template in test_chat_template), written to
// train.sft/val.sft with meta.json; val by fraction or by file; --max-len
// truncation counted, --no-truncate refused by file and line; the GSM8K file;
// corrupt SFT files; and one-line errors for bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "hf_tokenizer_fixture.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/chat_template.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sft_example_file.hpp"
#include "shardlm/data/sft_prepare.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;
using testing::hf_tokenizer_dir;
using testing::read_whole_file;

const std::string kSharedData = SHARDLM_SHARED_DATA_DIR;

class SftPrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardlm_sft_prepare_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string out() const { return (dir_ / "out").string(); }
  SftPrepareOptions options(const std::vector<std::string>& inputs) const {
    SftPrepareOptions o;
    o.tokenizer = hf_tokenizer_dir("qwen2");
    o.inputs = inputs;
    o.out_dir = out();
    return o;
  }
  void expect_error(const SftPrepareOptions& o, const std::vector<std::string>& phrases) {
    try {
      prepare_sft_dataset(o);
      ADD_FAILURE() << "expected an error containing '" << phrases.front() << "'";
    } catch (const Error& e) {
      for (const auto& phrase : phrases) EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(fs::path(o.out_dir) / "meta.json"));
  }
  fs::path dir_;
};

// What meta.json records for a tokenizer directory's own template: "sha256:" of the
// template text in its tokenizer_config.json (the directory renders with it).
std::string own_template_id(const std::string& tokenizer_dir) {
  std::ifstream in(fs::path(tokenizer_dir) / "tokenizer_config.json");
  const std::string text = nlohmann::json::parse(in).at("chat_template").get<std::string>();
  return "sha256:" + sha256_hex(text.data(), text.size());
}

const char* kThreeExamples =
    R"({"messages": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "first answer"}]})" "\n"
    R"({"prompt": "two", "response": "second answer", "system": "Be brief."})" "\n"
    R"({"instruction": "three", "input": "x", "output": "third answer"})" "\n";

TEST_F(SftPrepareTest, WritesExamplesMasksAndMeta) {
  SftPrepareOptions o = options({write("a.jsonl", kThreeExamples)});
  o.val_fraction = 0.34;  // floor(3 * 0.34) = 1: the last example
  const SftPrepareSummary summary = prepare_sft_dataset(o);
  const auto tokenizer = make_tokenizer(o.tokenizer);
  const std::vector<Conversation> conversations = read_chat_dataset(o.inputs[0]);
  const SftExampleFile train(summary.train_path), val(summary.val_path);
  ASSERT_EQ(train.num_examples(), 2);
  ASSERT_EQ(val.num_examples(), 1);
  int64_t targets = 0;
  for (int64_t e = 0; e < 3; ++e) {
    const SftExampleFile& file = e < 2 ? train : val;
    const int64_t index = e < 2 ? e : 0;
    const TokenizedChat chat = tokenize_chat(*tokenizer, ChatTemplate::chatml, conversations[e]);
    ASSERT_EQ(file.example_length(index), static_cast<int64_t>(chat.ids.size()));
    for (int64_t i = 0; i < file.example_length(index); ++i) {
      EXPECT_EQ(file.token(file.example_begin(index) + i), chat.ids[i]);
      EXPECT_EQ(file.is_target(file.example_begin(index) + i), chat.targets[i] != 0);
      if (e < 2) targets += chat.targets[i];
    }
  }
  const nlohmann::json meta = nlohmann::json::parse(read_whole_file(summary.meta_path));
  EXPECT_EQ(meta["kind"], "sft");
  // The qwen2 directory's own template (Qwen2.5's, which the chatml built-in equals).
  EXPECT_EQ(meta["chat_template"], own_template_id(o.tokenizer));
  EXPECT_EQ(meta["tokenizer"], tokenizer->spec());
  EXPECT_EQ(meta["train_examples"], 2);
  EXPECT_EQ(meta["val_examples"], 1);
  EXPECT_EQ(meta["train_tokens"], train.num_tokens());
  EXPECT_EQ(meta["train_target_tokens"], targets);
  EXPECT_EQ(meta["truncated_examples"], 0);
  EXPECT_TRUE(meta["max_len"].is_null());
  EXPECT_EQ(meta["token_dtype"], "uint32");
  EXPECT_EQ(meta["sources"][0]["examples"], 3);
  const SftDatasetMeta read = read_sft_dataset_meta(out());
  EXPECT_EQ(read.train.target_tokens, targets);
  EXPECT_EQ(read.val_fraction, std::optional<double>(0.34));
  EXPECT_TRUE(is_sft_dataset(out()));
  // A text-dataset reader refuses it by name.
  try {
    read_dataset_meta(out());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("describes an SFT dataset"), std::string::npos) << e.what();
  }
}

TEST_F(SftPrepareTest, TemplateFromTheTokenizerOrTheFlag) {
  SftPrepareOptions o = options({write("a.jsonl", kThreeExamples)});
  o.tokenizer = hf_tokenizer_dir("llama3");
  EXPECT_EQ(prepare_sft_dataset(o).meta.chat_template, own_template_id(o.tokenizer));
  o.out_dir = (dir_ / "plain").string();
  o.chat_template = "plain";
  const SftPrepareSummary plain = prepare_sft_dataset(o);
  EXPECT_EQ(plain.meta.chat_template, "plain");
  const auto tokenizer = make_tokenizer(o.tokenizer);
  const SftExampleFile file(plain.train_path);
  // plain ends the assistant turn with the tokenizer's eos_token (Llama 3 Instruct's
  // tokenizer_config.json names <|eot_id|>, as apply_chat_template would render it), a target.
  std::ifstream config(fs::path(o.tokenizer) / "tokenizer_config.json");
  const std::string eos = nlohmann::json::parse(config).at("eos_token").get<std::string>();
  const int64_t last = file.example_begin(1) - 3;  // ... answer <eos> "\n\n"
  EXPECT_EQ(file.token(last + 1), *tokenizer->special_token_id(eos));
  EXPECT_TRUE(file.is_target(last + 1));
}

TEST_F(SftPrepareTest, MaxLenTruncatesAndCounts) {
  SftPrepareOptions o = options({write("a.jsonl", kThreeExamples)});
  const auto tokenizer = make_tokenizer(o.tokenizer);
  std::vector<TokenizedChat> chats;
  for (const Conversation& c : read_chat_dataset(o.inputs[0]))
    chats.push_back(tokenize_chat(*tokenizer, ChatTemplate::chatml, c));
  // Cut just before the first example's first target: that one keeps no target and is
  // dropped; the others are cut and kept when longer, left whole when not.
  int64_t first_target = 0;
  while (!chats[0].targets[first_target]) ++first_target;
  o.max_len = first_target;
  int64_t truncated = 0, dropped = 0, kept_tokens = 0;
  for (const TokenizedChat& chat : chats) {
    const bool cut = static_cast<int64_t>(chat.ids.size()) > o.max_len;
    const int64_t kept = cut ? o.max_len : static_cast<int64_t>(chat.ids.size());
    const bool has_target = std::find(chat.targets.begin() + 1, chat.targets.begin() + kept, 1) != chat.targets.begin() + kept;
    dropped += !has_target;
    truncated += cut && has_target;
    kept_tokens += has_target ? kept : 0;
  }
  ASSERT_GE(dropped, 1);
  const SftPrepareSummary summary = prepare_sft_dataset(o);
  EXPECT_EQ(summary.meta.truncated_examples, truncated);
  EXPECT_EQ(summary.meta.dropped_examples, dropped);
  EXPECT_EQ(summary.meta.train.examples, 3 - dropped);
  EXPECT_EQ(summary.meta.train.tokens, kept_tokens);
  const SftExampleFile train(summary.train_path);
  for (int64_t e = 0; e < train.num_examples(); ++e) EXPECT_LE(train.example_length(e), o.max_len);
  EXPECT_EQ(read_sft_dataset_meta(out()).max_len, std::optional<int64_t>(o.max_len));

  // --no-truncate: the first over-long example by line and index, its tokens, how many
  // are longer and the --max-len that takes the longest (counted here from the chats).
  o.truncate = false;
  o.out_dir = (dir_ / "strict").string();
  int64_t longer = 0, longest = 0, longest_line = 0;
  const std::vector<Conversation> conversations = read_chat_dataset(o.inputs[0]);
  for (size_t i = 0; i < chats.size(); ++i) {
    const auto n = static_cast<int64_t>(chats[i].ids.size());
    longer += n > o.max_len;
    if (n > longest) longest = n, longest_line = conversations[i].line;
  }
  ASSERT_GE(longer, 2);
  expect_error(o, {fmt::format("a.jsonl line {} (example 1): the conversation has {} tokens, more than "
                               "--max-len {} (the sequence length), and --no-truncate does not cut it",
                               conversations[0].line, chats[0].ids.size(), o.max_len),
                   fmt::format("{} of the file's 3 examples are longer, the longest {} tokens (line {}): "
                               "raise --max-len to {} (ms-swift: --max_length), or leave out --no-truncate",
                               longer, longest, longest_line, longest)});
}

TEST_F(SftPrepareTest, ValFromItsOwnFile) {
  SftPrepareOptions o = options({write("train.jsonl", kThreeExamples)});
  o.val_inputs = {write("val.jsonl", R"({"prompt": "v", "response": "w"})")};
  const SftPrepareSummary summary = prepare_sft_dataset(o);
  EXPECT_EQ(summary.meta.train.examples, 3);
  EXPECT_EQ(summary.meta.val.examples, 1);
  EXPECT_FALSE(summary.meta.val_fraction.has_value());
  EXPECT_EQ(summary.meta.sources[1].split, "val");
}

TEST_F(SftPrepareTest, Gsm8kWithQwen) {
  SftPrepareOptions o = options({kSharedData + "/sft/gsm8k_test.jsonl"});
  const SftPrepareSummary summary = prepare_sft_dataset(o);
  EXPECT_EQ(summary.meta.train.examples, 1319);
  EXPECT_EQ(summary.meta.sources[0].sha256, "831898877c1c12557a1c734c7ff8024941ebf4135dee5e0d76e6c29308bedb8b");
  const SftExampleFile train(summary.train_path);
  EXPECT_EQ(train.num_tokens(), summary.meta.train.tokens);
  EXPECT_GT(summary.meta.train.target_tokens, summary.meta.train.tokens / 3);
}

TEST_F(SftPrepareTest, BadInputIsOneLine) {
  const std::string good = write("good.jsonl", kThreeExamples);
  SftPrepareOptions o = options({write("bad.jsonl", std::string(kThreeExamples) + "{broken\n")});
  expect_error(o, {"bad.jsonl line 4", "malformed JSON"});
  o.inputs = {write("role.jsonl", R"({"messages": [{"role": "robot", "content": "x"}]})")};
  expect_error(o, {"role.jsonl line 1", "unknown role \"robot\""});
  o.inputs = {write("noassistant.jsonl", R"({"messages": [{"role": "user", "content": "x"}]})")};
  expect_error(o, {"noassistant.jsonl line 1", "no assistant turn"});
  o.inputs = {write("empty.jsonl", "")};
  expect_error(o, {"empty.jsonl has no examples"});
  o.inputs = {good};
  o.chat_template = "alpaca";
  expect_error(o, {"unknown chat template 'alpaca'"});
  o.chat_template = "";
  o.inputs = {};
  expect_error(o, {"no input files"});
  o.inputs = {good};
  o.val_fraction = 0.5;
  o.val_inputs = {good};
  expect_error(o, {"--val-input and a val fraction"});
  o.val_inputs = {};
  o.val_fraction = 0.0;
  o.truncate = false;
  expect_error(o, {"--no-truncate needs --max-len"});
  o.truncate = true;
  o.tokenizer = "gpt2:" + kSharedData + "/gpt2";
  o.chat_template = "chatml";
  expect_error(o, {"chat template chatml needs the special token <|im_start|>"});
}

TEST_F(SftPrepareTest, CorruptSftFilesAreRefusedByName) {
  SftPrepareOptions o = options({write("a.jsonl", kThreeExamples)});
  const SftPrepareSummary summary = prepare_sft_dataset(o);
  const std::string good = read_whole_file(summary.train_path);
  const std::string path = (dir_ / "bad.sft").string();
  auto expect_open_error = [&](std::string bytes, const std::string& phrase) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      SftExampleFile file(path);
      ADD_FAILURE() << "expected '" << phrase << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  expect_open_error("", "is empty");
  std::string bad = good;
  bad[0] = 'X';
  expect_open_error(bad, "bad magic");
  expect_open_error(good.substr(0, good.size() - 1), "truncated or corrupt");
  bad = good;
  bad[bad.size() - 1] = 2;  // the last mask byte
  expect_open_error(bad, "mask byte 2");
  bad = good;
  bad[64 + 8] = 1;  // example 0 ends after 1 token
  expect_open_error(bad, "example 0 spans tokens");
  const int64_t tokens_at = 64 + 8 * 4;  // three examples: four offsets
  bad = good;
  for (int i = 0; i < 4; ++i) bad[tokens_at + i] = '\xff';
  expect_open_error(bad, "is not below the vocab size");
  EXPECT_EQ(SftExampleFile(summary.train_path).num_examples(), 3);
}

}  // namespace
}  // namespace shardlm
