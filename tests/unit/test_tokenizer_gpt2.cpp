// GPT-2 BPE against ids from two independent references (Hugging Face
// tokenizers and tiktoken, made by tools/make_tokenizer_fixture.py), plus
// round trips and bad tokenizer files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {
namespace {

const std::string kGpt2Dir = std::string(SHARDLM_SHARED_DATA_DIR) + "/gpt2";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer("gpt2:" + kGpt2Dir);
  return *tokenizer;
}

const nlohmann::json& fixture() {
  static const nlohmann::json cases =
      nlohmann::json::parse(read_file(std::string(SHARDLM_FIXTURE_DIR) + "/tokenizer_gpt2_cases.json"));
  return cases;
}

std::string ids_sha256(const std::vector<int32_t>& ids) {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids)
    for (int shift = 0; shift < 32; shift += 8) bytes.push_back(static_cast<char>((static_cast<uint32_t>(id) >> shift) & 0xFF));
  return sha256_hex(bytes.data(), bytes.size());
}

TEST(Gpt2Tokenizer, LoadsTheGpt2Vocabulary) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  ASSERT_TRUE(gpt2().end_of_text().has_value());
  EXPECT_EQ(*gpt2().end_of_text(), 50256);
  EXPECT_EQ(gpt2().spec(), "gpt2:" + std::filesystem::absolute(kGpt2Dir).lexically_normal().string());
  const std::vector<int32_t> eot = {50256, 198, 220};
  EXPECT_EQ(gpt2().decode(eot), "<|endoftext|>\n ");
}

TEST(Gpt2Tokenizer, MatchesReferenceIdsOnSmallStrings) {
  int checked = 0;
  for (const auto& item : fixture()["cases"]) {
    const std::string text = item["text"];
    const std::vector<int32_t> expected = item["ids"];
    EXPECT_EQ(gpt2().encode(text), expected) << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(gpt2().decode(expected), text);
    ++checked;
  }
  EXPECT_GT(checked, 400);
}

TEST(Gpt2Tokenizer, MatchesReferenceIdsOnRealText) {
  int checked = 0;
  for (const auto& slice : fixture()["slices"]) {
    const std::string file = std::string(SHARDLM_SHARED_DATA_DIR) + "/" + slice["file"].get<std::string>();
    const std::string text =
        read_file(file).substr(slice["byte_offset"].get<size_t>(), slice["byte_length"].get<size_t>());
    ASSERT_EQ(text.size(), slice["byte_length"].get<size_t>()) << file;
    const std::vector<int32_t> ids = gpt2().encode(text);
    const std::vector<int32_t> first_ids = slice["first_ids"];
    ASSERT_GE(ids.size(), first_ids.size());
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + first_ids.size()), first_ids) << file;
    EXPECT_EQ(static_cast<int64_t>(ids.size()), slice["token_count"].get<int64_t>()) << file;
    EXPECT_EQ(ids_sha256(ids), slice["ids_sha256"].get<std::string>()) << file << " at " << slice["byte_offset"];
    EXPECT_EQ(gpt2().decode(ids), text);
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(Gpt2Tokenizer, EndOfTextInsideTextIsOrdinaryText) {
  const std::vector<int32_t> ids = gpt2().encode("<|endoftext|>");
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 0);
}

TEST(Gpt2Tokenizer, RoundTripsArbitraryBytesIncludingInvalidUtf8) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(rng.below(64), '\0');
    for (char& c : bytes) c = static_cast<char>(rng.below(256));
    EXPECT_EQ(gpt2().decode(gpt2().encode(bytes)), bytes);
  }
  const std::string broken = "ok \xff\xfe then \xe6\x97 cut and \xc3";
  EXPECT_EQ(gpt2().decode(gpt2().encode(broken)), broken);
}

TEST(Gpt2Tokenizer, MatchesReferenceIdsOnLongWords) {
  int checked = 0;
  for (const auto& item : fixture()["long_cases"]) {
    const std::string text = item["text"];
    const std::vector<int32_t> ids = gpt2().encode(text);
    EXPECT_EQ(static_cast<int64_t>(ids.size()), item["token_count"].get<int64_t>()) << text.substr(0, 40);
    EXPECT_EQ(ids_sha256(ids), item["ids_sha256"].get<std::string>()) << text.substr(0, 40);
    EXPECT_EQ(gpt2().decode(ids), text);
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST(Gpt2Tokenizer, RoundTripsHugeWhitespaceRuns) {
  // One pre-token of 3 MB: the regex backtracks through all of it.
  const std::string text = "a" + std::string(3'000'000, ' ') + "b\n" + std::string(1'000'000, '\n');
  EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text);
}

TEST(Gpt2Tokenizer, DecodeRejectsOutOfRangeIds) {
  const std::vector<int32_t> bad = {15496, 50257};
  EXPECT_THROW(gpt2().decode(bad), Error);
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(gpt2().decode(negative), Error);
}

// Bad tokenizer directories: each error names the file and what was expected.
class Gpt2TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shardlm_tok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name, std::ios::binary) << content;
  }
  // A tiny valid vocabulary: the 256 bytes, "Ġt" and "<|endoftext|>".
  std::string tiny_vocab() {
    const std::string real = read_file(kGpt2Dir + "/vocab.json");
    nlohmann::json full = nlohmann::json::parse(real);
    nlohmann::json tiny = nlohmann::json::object();
    for (const auto& [text, id] : full.items())
      if (id.get<int>() < 256) tiny[text] = id;
    tiny["\u0120t"] = 256;
    tiny["<|endoftext|>"] = 257;
    return tiny.dump();
  }
  std::string expect_error(const std::string& must_contain) {
    try {
      make_tokenizer("gpt2:" + dir_.string());
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(must_contain), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "expected an Error containing '" << must_contain << "'";
    return "";
  }
  std::filesystem::path dir_;
};

TEST_F(Gpt2TokenizerFiles, TinyValidFilesLoadAndMerge) {
  write("vocab.json", tiny_vocab());
  write("merges.txt", "#version: 0.2\n\u0120 t\n");
  const auto tokenizer = make_tokenizer("gpt2:" + dir_.string());
  EXPECT_EQ(tokenizer->vocab_size(), 258);
  EXPECT_EQ(tokenizer->end_of_text(), std::optional<int32_t>(257));
  EXPECT_EQ(tokenizer->encode(" t"), (std::vector<int32_t>{256}));
  // GPT-2 numbers printable ASCII from '!' = 0, so 'o' is 'o' - '!' = 78; ' ' is 220.
  EXPECT_EQ(tokenizer->encode(" to"), (std::vector<int32_t>{256, 'o' - '!'}));
  EXPECT_EQ(tokenizer->encode("o t"), (std::vector<int32_t>{'o' - '!', 256}));
  EXPECT_EQ(tokenizer->encode("  "), (std::vector<int32_t>{220, 220}));
}

TEST_F(Gpt2TokenizerFiles, MissingVocab) {
  write("merges.txt", "#version: 0.2\n");
  expect_error((dir_ / "vocab.json").string());
}

TEST_F(Gpt2TokenizerFiles, MissingMerges) {
  write("vocab.json", tiny_vocab());
  expect_error((dir_ / "merges.txt").string());
}

TEST_F(Gpt2TokenizerFiles, VocabNotJson) {
  write("vocab.json", "{\"a\": 0,");
  write("merges.txt", "#version: 0.2\n");
  expect_error("not valid JSON");
}

TEST_F(Gpt2TokenizerFiles, VocabNotAnObject) {
  write("vocab.json", "[1, 2, 3]");
  write("merges.txt", "#version: 0.2\n");
  expect_error("expected GPT-2's vocab.json");
}

TEST_F(Gpt2TokenizerFiles, VocabIdOutOfRange) {
  nlohmann::json vocab = nlohmann::json::parse(tiny_vocab());
  vocab["<|endoftext|>"] = 9999;
  write("vocab.json", vocab.dump());
  write("merges.txt", "#version: 0.2\n");
  expect_error("has id 9999");
}

TEST_F(Gpt2TokenizerFiles, VocabMissingAByte) {
  nlohmann::json vocab = nlohmann::json::parse(tiny_vocab());
  vocab.erase("A");  // byte 65, GPT-2 id 'A' - '!' = 32
  vocab["zz"] = 32;
  write("vocab.json", vocab.dump());
  write("merges.txt", "#version: 0.2\n");
  expect_error("no token for byte 65");
}

TEST_F(Gpt2TokenizerFiles, MergeOfUnknownTokens) {
  write("vocab.json", tiny_vocab());
  write("merges.txt", "#version: 0.2\n\u0120 t\nq x\n");
  const std::string message = expect_error("line 3");
  EXPECT_NE(message.find("not in vocab.json"), std::string::npos) << message;
}

TEST_F(Gpt2TokenizerFiles, MalformedMergeLine) {
  write("vocab.json", tiny_vocab());
  write("merges.txt", "#version: 0.2\n\u0120t\n");
  expect_error("expected two tokens separated by one space");
}

TEST_F(Gpt2TokenizerFiles, EmptyMerges) {
  write("vocab.json", tiny_vocab());
  write("merges.txt", "");
  expect_error("has no merges");
}

TEST(MakeTokenizer, RejectsUnknownSpecs) {
  EXPECT_THROW(make_tokenizer("sentencepiece"), Error);
  EXPECT_THROW(make_tokenizer("gpt2:"), Error);
  EXPECT_THROW(make_tokenizer(""), Error);
}

}  // namespace
}  // namespace shardlm
