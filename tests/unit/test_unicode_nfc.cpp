// NFC against Python's unicodedata.normalize (cases made by
// tools/make_unicode_tables.py, which also checks them against Hugging Face
// tokenizers' NFC normalizer): every code point NFC may change, alone and among
// marks, and random mixes of marks, Hangul jamo and starters.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "shardlm/data/unicode_nfc.hpp"

namespace shardlm {
namespace {

nlohmann::json cases() {
  std::ifstream in(std::string(SHARDLM_FIXTURE_DIR) + "/unicode_nfc_cases.json", std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  return nlohmann::json::parse(content.str());
}

TEST(UnicodeNfc, MatchesPythonOnEveryUnstableCodePointAndRandomMixes) {
  const nlohmann::json fixture = cases();
  EXPECT_EQ(fixture["unicode_version"], nfc_unicode_version());
  const auto& inputs = fixture["inputs"];
  const auto& expected = fixture["expected"];
  ASSERT_EQ(inputs.size(), expected.size());
  ASSERT_GT(inputs.size(), 9000u);
  int changed = 0, failures = 0;
  for (size_t i = 0; i < inputs.size() && failures < 20; ++i) {
    const std::string input = inputs[i];
    const std::string want = expected[i];
    const std::string got = nfc_normalize(input);
    if (got != want) {
      ++failures;
      ADD_FAILURE() << "case " << i << ": " << nlohmann::json(input).dump() << " -> " << nlohmann::json(got).dump()
                    << ", expected " << nlohmann::json(want).dump();
    }
    changed += input != want;
    EXPECT_EQ(nfc_normalize(want), want) << "NFC is not idempotent on case " << i;
  }
  EXPECT_GT(changed, 6000);
}

TEST(UnicodeNfc, LeavesStableTextAndInvalidBytesAlone) {
  EXPECT_EQ(nfc_normalize(""), "");
  EXPECT_EQ(nfc_normalize("plain ASCII, Latin-1 caf\xc3\xa9, \xe4\xb8\xad\xe6\x96\x87"),
            "plain ASCII, Latin-1 caf\xc3\xa9, \xe4\xb8\xad\xe6\x96\x87");
  // e + COMBINING ACUTE -> U+00E9; the invalid bytes around it stay as they are.
  EXPECT_EQ(nfc_normalize("\xff" "e\xcc\x81" "\xfe\xc3"), "\xff\xc3\xa9\xfe\xc3");
  // A mark after an invalid byte has nothing to combine with.
  EXPECT_EQ(nfc_normalize("\xff\xcc\x81"), "\xff\xcc\x81");
}

}  // namespace
}  // namespace shardlm
