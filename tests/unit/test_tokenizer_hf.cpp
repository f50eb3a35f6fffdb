// Hugging Face tokenizer.json (byte-level BPE) against the ids PyPI `tokenizers`
// gives for the same files (tests/fixtures/tokenizer_hf_cases.json, made by
// tools/make_tokenizer_fixture.py): GPT-2's, a Qwen2-style (NFC, Qwen2 regex,
// merges derived from qwen.tiktoken) and a Llama-3-style (Llama 3 regex, BOS
// template, ignore_merges) tokenizer.json on multilingual text, with special
// tokens recognized and as text; tokenizer.json variants (Split behaviours,
// invert, prefix space, NFC with normalized added tokens, ignore_merges,
// BOS/EOS template); specs with content hashes; and bad files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hf_tokenizer_fixture.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/hf_tokenizer.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;
using testing::hf_tokenizer_dir;
using testing::first_code_points;
using testing::ids_sha256;
using testing::read_whole_file;

const nlohmann::json& fixture() {
  static const nlohmann::json cases =
      nlohmann::json::parse(read_whole_file(std::string(SHARDLM_FIXTURE_DIR) + "/tokenizer_hf_cases.json"));
  return cases;
}

const Tokenizer& hf(const std::string& kind) { return testing::hf_tokenizer(kind); }

// What Hugging Face's encode(text) gives: specials recognized, post-processor ids around.
std::vector<int32_t> hf_encode(const Tokenizer& tokenizer, const std::string& text) {
  const Tokenizer::Frame frame = tokenizer.frame();
  std::vector<int32_t> ids = frame.prefix;
  const std::vector<int32_t> body = tokenizer.encode(text, SpecialTokens::recognized);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), frame.suffix.begin(), frame.suffix.end());
  return ids;
}

void expect_cases(const Tokenizer& tokenizer, const nlohmann::json& cases, bool round_trip, const std::string& what) {
  for (const auto& item : cases) {
    const std::string text = item["text"];
    const std::vector<int32_t> ids = item["ids"];
    const std::vector<int32_t> as_text = item["ids_as_text"];
    EXPECT_EQ(hf_encode(tokenizer, text), ids) << what << " text: " << nlohmann::json(text).dump();
    EXPECT_EQ(tokenizer.encode(text), as_text) << what << " (special tokens as text) text: "
                                               << nlohmann::json(text).dump();
    if (round_trip) {
      EXPECT_EQ(tokenizer.decode(tokenizer.encode(text, SpecialTokens::recognized)), tokenizer.normalize(text)) << text;
      EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), tokenizer.normalize(text)) << text;
    }
  }
}

class HfTokenizerKinds : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerKinds, MatchesTokenizersOnMultilingualText) {
  const auto& cases = fixture()["kinds"][GetParam()]["cases"];
  ASSERT_GT(cases.size(), 150u);
  expect_cases(hf(GetParam()), cases, true, GetParam());
}

TEST_P(HfTokenizerKinds, MatchesTokenizersOnLongText) {
  const std::string war = read_whole_file(std::string(SHARDLM_SHARED_DATA_DIR) + "/war_and_peace.txt");
  // The fixture's long texts (its "long_texts" says how they are made).
  const auto& cases = fixture()["kinds"][GetParam()]["cases"];
  std::string joined;
  for (size_t i = 0; i < fixture()["hand_written_cases"].get<size_t>(); ++i) {
    if (i > 0) joined += '\n';
    joined += cases[i]["text"].get<std::string>();
  }
  std::string repeated;
  for (int i = 0; i < 50; ++i) repeated += joined;
  const std::string texts[2] = {first_code_points(war, 200000), repeated};
  const auto& longs = fixture()["kinds"][GetParam()]["long"];
  ASSERT_EQ(longs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const std::vector<int32_t> ids = hf_encode(hf(GetParam()), texts[i]);
    EXPECT_EQ(static_cast<int64_t>(ids.size()), longs[i]["token_count"].get<int64_t>()) << longs[i]["name"];
    EXPECT_EQ(ids_sha256(ids), longs[i]["ids_sha256"].get<std::string>()) << longs[i]["name"];
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTokenizerKinds, ::testing::Values("gpt2", "qwen2", "llama3"));

TEST(HfTokenizer, KnowsItsSpecialTokensBosAndEndOfText) {
  const Tokenizer& qwen = hf("qwen2");
  EXPECT_EQ(qwen.vocab_size(), 151665);
  EXPECT_EQ(qwen.special_token_id("<|im_start|>"), std::optional<int32_t>(151644));
  EXPECT_EQ(qwen.special_token_id("<|im_end|>"), std::optional<int32_t>(151645));
  EXPECT_EQ(qwen.special_token_id("<tool_call>"), std::optional<int32_t>(151657));
  EXPECT_EQ(qwen.end_of_text(), std::optional<int32_t>(151643));
  EXPECT_TRUE(qwen.frame().prefix.empty() && qwen.frame().suffix.empty());
  // NFC: e + COMBINING ACUTE is encoded as U+00E9.
  EXPECT_EQ(qwen.encode("caf\x65\xcc\x81"), qwen.encode("caf\xc3\xa9"));

  const Tokenizer& llama = hf("llama3");
  EXPECT_EQ(llama.vocab_size(), 151643 + 256);
  EXPECT_EQ(llama.frame().prefix, (std::vector<int32_t>{151643}));  // <|begin_of_text|>
  EXPECT_EQ(llama.end_of_text(), llama.special_token_id("<|end_of_text|>"));
  EXPECT_EQ(llama.special_token_id("<|eot_id|>"), std::optional<int32_t>(151643 + 9));
  EXPECT_EQ(llama.normalize("e\xcc\x81"), "e\xcc\x81");  // no normalizer

  const Tokenizer& gpt2 = hf("gpt2");
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  EXPECT_EQ(gpt2.end_of_text(), std::optional<int32_t>(50256));
  // The same ids as the vocab.json + merges.txt tokenizer.
  const auto classic = make_tokenizer("gpt2:" + std::string(SHARDLM_SHARED_DATA_DIR) + "/gpt2");
  const std::string text = read_whole_file(std::string(SHARDLM_SHARED_DATA_DIR) + "/tinyshakespeare.txt").substr(0, 50000);
  EXPECT_EQ(gpt2.encode(text), classic->encode(text));
}

TEST(HfTokenizer, VariantsMatchTokenizers) {
  const auto& variants = fixture()["kinds"]["gpt2"]["variants"];
  ASSERT_GE(variants.size(), 15u);
  const nlohmann::json base = nlohmann::json::parse(read_whole_file(hf_tokenizer_dir("gpt2") + "/tokenizer.json"));
  const fs::path dir = fs::temp_directory_path() / ("shardlm_hf_variant_" + std::to_string(::getpid()));
  for (const auto& variant : variants) {
    nlohmann::json content = base;
    for (const auto& [key, value] : variant["tokenizer_json"].items()) content[key] = value;
    for (const auto& [key, value] : variant["model"].items()) content["model"][key] = value;
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << content.dump();
    const auto tokenizer = make_tokenizer("hf:" + dir.string());
    expect_cases(*tokenizer, variant["cases"], false, variant["name"]);
  }
  fs::remove_all(dir);
}

TEST(HfTokenizer, SpecCarriesTheFilesHashAndRebuildsTheSameTokenizer) {
  const std::string dir = hf_tokenizer_dir("qwen2");
  const Tokenizer& qwen = hf("qwen2");
  const std::string hash = hf_tokenizer_files_sha256(dir);
  const std::string both = read_whole_file(dir + "/tokenizer.json") + read_whole_file(dir + "/tokenizer_config.json");
  EXPECT_EQ(hash, sha256_hex(both.data(), both.size()));
  EXPECT_EQ(qwen.spec(), "hf:" + fs::absolute(dir).lexically_normal().string() + "#sha256=" + hash);
  const auto again = make_tokenizer(qwen.spec());
  EXPECT_EQ(again->spec(), qwen.spec());
  EXPECT_EQ(again->encode("<|im_start|>hi", SpecialTokens::recognized), (std::vector<int32_t>{151644, 6023}));
  const TokenizerSpec parsed = parse_tokenizer_spec(qwen.spec());
  EXPECT_EQ(parsed.kind, "hf");
  EXPECT_EQ(parsed.path, fs::absolute(dir).lexically_normal().string());
  EXPECT_EQ(parsed.sha256, hash);
}

// Bad tokenizer directories: one-line errors naming the file and the field.
class HfTokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardlm_hf_bad_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    base_ = nlohmann::json::parse(read_whole_file(hf_tokenizer_dir("gpt2") + "/tokenizer.json"));
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const nlohmann::json& content) { std::ofstream(dir_ / "tokenizer.json") << content.dump(); }
  std::string expect_error(const std::vector<std::string>& phrases, const std::string& spec = "") {
    try {
      make_tokenizer(spec.empty() ? "hf:" + dir_.string() : spec);
    } catch (const Error& e) {
      const std::string message = e.what();
      for (const std::string& phrase : phrases) EXPECT_NE(message.find(phrase), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      return message;
    }
    ADD_FAILURE() << "expected an Error containing '" << phrases.front() << "'";
    return "";
  }
  fs::path dir_;
  nlohmann::json base_;
};

TEST_F(HfTokenizerFiles, MissingTokenizerJson) {
  expect_error({dir_.string(), "has no tokenizer.json"});
  expect_error({"has no tokenizer.json"}, dir_.string());
}

TEST_F(HfTokenizerFiles, MalformedJson) {
  std::ofstream(dir_ / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\",";
  expect_error({(dir_ / "tokenizer.json").string(), "is not valid JSON"});
}

TEST_F(HfTokenizerFiles, MalformedTokenizerConfig) {
  write(base_);
  std::ofstream(dir_ / "tokenizer_config.json") << "{oops";
  expect_error({(dir_ / "tokenizer_config.json").string(), "is not valid JSON"});
}

TEST_F(HfTokenizerFiles, UnsupportedModelType) {
  base_["model"]["type"] = "WordPiece";
  write(base_);
  expect_error({"tokenizer.json", "model.type", "\"WordPiece\"", "expected \"BPE\""});
}

TEST_F(HfTokenizerFiles, UnsupportedFieldsAreNamed) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::vector<std::string>>> cases = {
      {[](nlohmann::json& j) { j["model"]["byte_fallback"] = true; }, {"model.byte_fallback", "true"}},
      {[](nlohmann::json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout", "0.1"}},
      {[](nlohmann::json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       {"model.continuing_subword_prefix", "\"##\""}},
      {[](nlohmann::json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, {"normalizer.type", "\"NFKC\""}},
      {[](nlohmann::json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}}}}; },
       {"normalizer.normalizers[0].type", "\"Lowercase\""}},
      {[](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, {"pre_tokenizer.type", "\"Whitespace\""}},
      {[](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\d"}}},
                                                     {"behavior", "Isolated"}, {"invert", false}}; },
       {"pre_tokenizer", "has no ByteLevel step"}},
      {[](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}; },
       {"Split pattern", "(unclosed", "not a valid regular expression"}},
      {[](nlohmann::json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; },
       {"post_processor.type", "\"RobertaProcessing\""}},
      {[](nlohmann::json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder.type", "\"WordPiece\""}},
      {[](nlohmann::json& j) { j["added_tokens"][0]["lstrip"] = true; }, {"added_tokens[0].lstrip"}},
      {[](nlohmann::json& j) { j["truncation"] = {{"max_length", 8}}; }, {"truncation"}},
      {[](nlohmann::json& j) { j["model"]["merges"][3] = "Ġ zzzzqq"; }, {"model.merges[3]", "zzzzqq", "not in model.vocab"}},
      {[](nlohmann::json& j) { j["model"]["merges"][4] = "onlyone"; }, {"model.merges[4]", "two tokens"}},
      {[](nlohmann::json& j) { j["model"]["vocab"].erase("A"); }, {"model.vocab", "byte 65"}},
      {[](nlohmann::json& j) { j["model"]["vocab"]["\n"] = 7; }, {"byte-level alphabet"}},
      {[](nlohmann::json& j) { j["mystery"] = 1; }, {"top level.mystery"}},
  };
  for (const auto& [mutate, phrases] : cases) {
    nlohmann::json content = base_;
    mutate(content);
    write(content);
    const std::string message = expect_error(phrases);
    EXPECT_NE(message.find((dir_ / "tokenizer.json").string()), std::string::npos) << message;
  }
}

TEST_F(HfTokenizerFiles, ChangedFilesAreDetectedThroughTheSpec) {
  write(base_);
  std::ofstream(dir_ / "tokenizer_config.json") << "{\"eos_token\": \"<|endoftext|>\"}";
  const std::string spec = make_tokenizer("hf:" + dir_.string())->spec();
  std::ofstream(dir_ / "tokenizer_config.json") << "{\"eos_token\": \"<|endoftext|>\", \"x\": 1}";
  expect_error({"changed since the data was prepared", dir_.string()}, spec);
  expect_error({"expected 64 lowercase hex digits"}, "hf:" + dir_.string() + "#sha256=abc");
}

TEST(MakeTokenizerSpecs, RejectsUnknownOnes) {
  EXPECT_THROW(make_tokenizer("hf:"), Error);
  EXPECT_THROW(make_tokenizer("sentencepiece:x"), Error);
  EXPECT_THROW(parse_tokenizer_spec("tiktoken:nosuchpreset:/x"), Error);
  EXPECT_EQ(parse_tokenizer_spec("tiktoken:/a/qwen.tiktoken").preset, "qwen");
  EXPECT_EQ(parse_tokenizer_spec("tiktoken:qwen:/a/b").path, "/a/b");
}

}  // namespace
}  // namespace shardlm
