// `prepare`: token counts, the train/val split, meta.json, end-of-text between
// files, atomic outputs, and clear errors for bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hf_tokenizer_fixture.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

const std::string kSharedData = SHARDLM_SHARED_DATA_DIR;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

std::vector<int32_t> all_tokens(const std::string& path) {
  TokenFile file(path);
  std::vector<int32_t> tokens(file.size());
  file.read(0, file.size(), tokens.data());
  return tokens;
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardlm_prepare_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write_input(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string out() const { return (dir_ / "out").string(); }
  void expect_error(const PrepareOptions& options, const std::string& phrase) {
    try {
      prepare_dataset(options);
      ADD_FAILURE() << "prepare should fail with '" << phrase << "'";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(phrase), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  bool no_temp_files_left() const {
    for (const auto& entry : fs::recursive_directory_iterator(dir_))
      if (entry.path().string().find(".tmp") != std::string::npos) return false;
    return true;
  }
  fs::path dir_;
};

TEST_F(PrepareTest, ByteTokenizerSplitsTheLastFractionIntoVal) {
  const std::string text = "abcdefghijklmnopqrstuvwxyz0123456789!?";  // 38 bytes
  PrepareOptions options;
  options.tokenizer = "byte";
  options.inputs = {write_input("a.txt", text)};
  options.out_dir = out();
  options.val_fraction = 0.25;
  const PrepareSummary summary = prepare_dataset(options);
  EXPECT_EQ(summary.meta.train_tokens, 29);  // 38 - floor(38 * 0.25)
  EXPECT_EQ(summary.meta.val_tokens, 9);
  EXPECT_EQ(summary.train_path, (fs::path(out()) / "train.bin").string());
  std::vector<int32_t> train = all_tokens(summary.train_path);
  std::vector<int32_t> val = all_tokens(summary.val_path);
  EXPECT_EQ(std::string(train.begin(), train.end()), text.substr(0, 29));
  EXPECT_EQ(std::string(val.begin(), val.end()), text.substr(29));
  EXPECT_EQ(TokenFile(summary.train_path).vocab_size(), 256);
  EXPECT_TRUE(no_temp_files_left());
}

TEST_F(PrepareTest, MetaJsonRecordsTheRun) {
  const std::string text = "hello\n";
  PrepareOptions options;
  options.inputs = {write_input("h.txt", text)};
  options.out_dir = out();
  options.val_fraction = 0.0;
  prepare_dataset(options);
  const nlohmann::json meta = nlohmann::json::parse(read_bytes((fs::path(out()) / "meta.json").string()));
  EXPECT_EQ(meta["format_version"], 1);
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_TRUE(meta["end_of_text"].is_null());
  EXPECT_EQ(meta["token_dtype"], "uint16");
  EXPECT_EQ(meta["train_tokens"], 6);
  EXPECT_EQ(meta["val_tokens"], 0);
  EXPECT_EQ(meta["val_fraction"], 0.0);
  ASSERT_EQ(meta["sources"].size(), 1u);
  EXPECT_EQ(meta["sources"][0]["path"], fs::absolute(dir_ / "h.txt").string());
  EXPECT_EQ(meta["sources"][0]["bytes"], 6);
  EXPECT_EQ(meta["sources"][0]["tokens"], 6);
  // sha256("hello\n"), as printed by sha256sum.
  EXPECT_EQ(meta["sources"][0]["sha256"], "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03");

  const DatasetMeta read = read_dataset_meta(out());
  EXPECT_EQ(read.tokenizer, "byte");
  EXPECT_EQ(read.vocab_size, 256);
  EXPECT_EQ(read.train_tokens, 6);
  EXPECT_FALSE(read.end_of_text.has_value());
  ASSERT_EQ(read.sources.size(), 1u);
  EXPECT_EQ(read.sources[0].bytes, 6);
}

TEST_F(PrepareTest, ByteTokenizerConcatenatesFilesWithoutSeparator) {
  PrepareOptions options;
  options.inputs = {write_input("a.txt", "one"), write_input("b.txt", "two")};
  options.out_dir = out();
  options.val_fraction = 0.0;
  const PrepareSummary summary = prepare_dataset(options);
  const std::vector<int32_t> train = all_tokens(summary.train_path);
  EXPECT_EQ(std::string(train.begin(), train.end()), "onetwo");
  ASSERT_EQ(summary.meta.sources.size(), 2u);
  EXPECT_EQ(summary.meta.sources[1].tokens, 3);
}

TEST_F(PrepareTest, Gpt2PutsEndOfTextBetweenFiles) {
  PrepareOptions options;
  options.tokenizer = "gpt2:" + kSharedData + "/gpt2";
  options.inputs = {write_input("a.txt", "Hello world"), write_input("b.txt", " it's")};
  options.out_dir = out();
  options.val_fraction = 0.0;
  const PrepareSummary summary = prepare_dataset(options);
  // Ids from Hugging Face tokenizers (see tests/fixtures/tokenizer_gpt2_cases.json).
  EXPECT_EQ(all_tokens(summary.train_path), (std::vector<int32_t>{15496, 995, 50256, 340, 338}));
  EXPECT_EQ(summary.meta.end_of_text, std::optional<int32_t>(50256));
  EXPECT_EQ(summary.meta.vocab_size, 50257);
  EXPECT_EQ(read_dataset_meta(out()).end_of_text, std::optional<int32_t>(50256));
}

TEST_F(PrepareTest, TinyShakespeareWithGpt2) {
  const std::string input = kSharedData + "/tinyshakespeare.txt";
  PrepareOptions options;
  options.tokenizer = "gpt2:" + kSharedData + "/gpt2";
  options.inputs = {input};
  options.out_dir = out();
  const PrepareSummary summary = prepare_dataset(options);
  // 338025 tokens: the reference count from tools/make_tokenizer_fixture.py.
  EXPECT_EQ(summary.meta.train_tokens + summary.meta.val_tokens, 338025);
  EXPECT_EQ(summary.meta.val_tokens, 33802);  // floor(338025 * 0.1)
  EXPECT_EQ(summary.meta.sources[0].sha256, "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed");
  EXPECT_EQ(summary.meta.sources[0].bytes, 1115394);
  EXPECT_EQ(TokenFile(summary.train_path).token_bytes(), 2);
  std::vector<int32_t> tokens = all_tokens(summary.train_path);
  const std::vector<int32_t> val = all_tokens(summary.val_path);
  tokens.insert(tokens.end(), val.begin(), val.end());
  const auto tokenizer = make_tokenizer(read_dataset_meta(out()).tokenizer);
  EXPECT_EQ(tokenizer->decode(tokens), read_bytes(input));
}

TEST_F(PrepareTest, HuggingFaceTokenizerDirectoryRecordsItsSpecWithHash) {
  const std::string tokenizer_dir = testing::hf_tokenizer_dir("llama3");
  PrepareOptions options;
  options.tokenizer = tokenizer_dir;  // a plain directory holding tokenizer.json
  options.inputs = {write_input("a.txt", "Hello world <|eot_id|>"), write_input("b.txt", "Second file.")};
  options.out_dir = out();
  options.val_fraction = 0.0;
  const PrepareSummary summary = prepare_dataset(options);
  const auto tokenizer = make_tokenizer(tokenizer_dir);
  EXPECT_EQ(summary.meta.tokenizer, tokenizer->spec());
  EXPECT_NE(summary.meta.tokenizer.find("#sha256="), std::string::npos);
  const int32_t bos = tokenizer->frame().prefix.at(0);
  const int32_t eot = *tokenizer->end_of_text();
  // Each file: <|begin_of_text|> + its ids (special-token text stays text); <|end_of_text|> between files.
  std::vector<int32_t> expected = {bos};
  for (int32_t id : tokenizer->encode("Hello world <|eot_id|>")) expected.push_back(id);
  expected.push_back(eot);
  expected.push_back(bos);
  for (int32_t id : tokenizer->encode("Second file.")) expected.push_back(id);
  EXPECT_EQ(all_tokens(summary.train_path), expected);
  EXPECT_EQ(std::count(expected.begin(), expected.end(), *tokenizer->special_token_id("<|eot_id|>")), 0);
  EXPECT_EQ(summary.meta.vocab_size, 151643 + 256);
  EXPECT_EQ(TokenFile(summary.train_path).token_bytes(), 4);
  // meta.json's spec rebuilds the same tokenizer (train/sample/eval do this).
  EXPECT_EQ(make_tokenizer(read_dataset_meta(out()).tokenizer)->encode("Second file."), tokenizer->encode("Second file."));
}

TEST_F(PrepareTest, TiktokenRankFile) {
  PrepareOptions options;
  options.tokenizer = "tiktoken:" + kSharedData + "/qwen/qwen.tiktoken";
  options.inputs = {write_input("a.txt", "你好 <|im_end|>"), write_input("b.txt", "x")};
  options.out_dir = out();
  options.val_fraction = 0.0;
  const PrepareSummary summary = prepare_dataset(options);
  EXPECT_EQ(summary.meta.tokenizer.rfind("tiktoken:qwen:/", 0), 0u) << summary.meta.tokenizer;
  EXPECT_EQ(summary.meta.end_of_text, std::optional<int32_t>(151643));
  const std::vector<int32_t> tokens = all_tokens(summary.train_path);
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), 151645), 0);  // <|im_end|> text stays text
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), 151643), 1);
}

TEST_F(PrepareTest, RejectsBadInputWithOneLineErrors) {
  PrepareOptions options;
  options.out_dir = out();
  expect_error(options, "no input files");

  options.inputs = {(dir_ / "missing.txt").string()};
  expect_error(options, "missing.txt does not exist");

  options.inputs = {write_input("empty.txt", "")};
  expect_error(options, "empty.txt is empty");

  options.inputs = {dir_.string()};
  expect_error(options, "is not a regular file");

  options.inputs = {write_input("ok.txt", "fine")};
  for (double bad : {1.0, -0.1, std::nan("")}) {
    options.val_fraction = bad;
    expect_error(options, "val fraction");
  }
  options.val_fraction = 0.1;
  options.tokenizer = "wordpiece";
  expect_error(options, "unknown tokenizer 'wordpiece'");
  options.tokenizer = dir_.string();  // a directory without tokenizer.json
  expect_error(options, "has no tokenizer.json");

  options.tokenizer = "byte";
  options.out_dir = write_input("a_file", "x");
  expect_error(options, "cannot create output directory");
}

TEST_F(PrepareTest, FailedPrepareLeavesThePreviousDatasetIntact) {
  PrepareOptions options;
  options.inputs = {write_input("a.txt", "first dataset")};
  options.out_dir = out();
  prepare_dataset(options);
  const std::string train_before = read_bytes((fs::path(out()) / "train.bin").string());
  const std::string meta_before = read_bytes((fs::path(out()) / "meta.json").string());

  options.inputs = {write_input("b.txt", "second"), (dir_ / "missing.txt").string()};
  EXPECT_THROW(prepare_dataset(options), Error);
  EXPECT_EQ(read_bytes((fs::path(out()) / "train.bin").string()), train_before);
  EXPECT_EQ(read_bytes((fs::path(out()) / "meta.json").string()), meta_before);
  EXPECT_TRUE(no_temp_files_left());
}

TEST_F(PrepareTest, ReadMetaErrorsNameTheFileAndField) {
  const std::string meta_path = (fs::path(out()) / "meta.json").string();
  auto expect_meta_error = [&](const std::string& phrase) {
    try {
      read_dataset_meta(out());
      ADD_FAILURE() << "expected '" << phrase << "'";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(meta_path), std::string::npos) << message;
      EXPECT_NE(message.find(phrase), std::string::npos) << message;
    }
  };
  expect_meta_error("cannot read");
  fs::create_directories(out());
  std::ofstream(meta_path) << "{not json";
  expect_meta_error("not valid JSON");

  PrepareOptions options;
  options.inputs = {write_input("a.txt", "some text")};
  options.out_dir = out();
  prepare_dataset(options);
  nlohmann::json meta = nlohmann::json::parse(read_bytes(meta_path));
  meta.erase("vocab_size");
  std::ofstream(meta_path, std::ios::trunc) << meta.dump();
  expect_meta_error("missing field \"vocab_size\"");
  meta["vocab_size"] = "big";
  std::ofstream(meta_path, std::ios::trunc) << meta.dump();
  expect_meta_error("field \"vocab_size\" is \"big\"");
  meta["vocab_size"] = 256;
  meta["format_version"] = 9;
  std::ofstream(meta_path, std::ios::trunc) << meta.dump();
  expect_meta_error("format_version 9");
}

}  // namespace
}  // namespace shardlm
