// GSM8K exact-match scoring (train/gsm8k.hpp) on a hand-made file
// (tests/fixtures/gsm8k_scoring_cases.jsonl): each line a reference response, a model
// reply and whether they match by hand (commas, negatives, decimals, dollar signs,
// "####" against the last number, no number at all), and the accuracy counted over
// the file.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "shardlm/core/error.hpp"
#include "shardlm/train/gsm8k.hpp"

namespace {

using shardlm::Gsm8kScore;

TEST(Gsm8kScoring, HandMadeCasesAndTheirAccuracy) {
  std::ifstream in(std::string(SHARDLM_FIXTURE_DIR) + "/gsm8k_scoring_cases.jsonl");
  ASSERT_TRUE(in.good());
  Gsm8kScore score;
  int64_t lines = 0, expected_correct = 0, expected_without = 0;
  std::string text;
  while (std::getline(in, text)) {
    const auto line = nlohmann::json::parse(text);
    const bool expected = line.at("match").get<bool>();
    EXPECT_EQ(score.add(line.at("generated").get<std::string>(),
                        line.at("response").get<std::string>()),
              expected)
        << line.at("why").get<std::string>();
    ++lines;
    expected_correct += expected ? 1 : 0;
    expected_without += line.value("no_answer", false) ? 1 : 0;
  }
  ASSERT_EQ(lines, 14);
  EXPECT_EQ(score.total, 14);
  EXPECT_EQ(score.correct, 8);  // counted by hand: the lines marked "match": true
  EXPECT_EQ(score.correct, expected_correct);
  EXPECT_EQ(score.without_answer, 2);
  EXPECT_EQ(score.without_answer, expected_without);
  EXPECT_DOUBLE_EQ(score.accuracy(), 8.0 / 14.0);
}

TEST(Gsm8kScoring, ExtractionAndNormalization) {
  EXPECT_EQ(shardlm::gsm8k_extract_answer("so 1,000,000 people"), "1000000");
  EXPECT_EQ(shardlm::gsm8k_extract_answer("#### -12.5"), "-12.5");
  EXPECT_EQ(shardlm::gsm8k_extract_answer("x = -7"), "-7");
  EXPECT_EQ(shardlm::gsm8k_extract_answer("costs $5."), "5");
  EXPECT_FALSE(shardlm::gsm8k_extract_answer("none here").has_value());
  EXPECT_EQ(shardlm::gsm8k_reference_answer("a\n#### 3,600"), "3600");
  EXPECT_FALSE(shardlm::gsm8k_reference_answer("no marker").has_value());
  Gsm8kScore s;
  EXPECT_THROW(s.add("1", "no marker"), shardlm::Error);
  EXPECT_EQ(s.accuracy(), 0.0);
}

}  // namespace
