// The byte tokenizer: ids are the bytes themselves.
#include <gtest/gtest.h>

#include "shardlm/core/error.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {
namespace {

TEST(ByteTokenizer, IdsAreBytes) {
  const auto tokenizer = make_tokenizer("byte");
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  EXPECT_EQ(tokenizer->spec(), "byte");
  EXPECT_FALSE(tokenizer->end_of_text().has_value());
  EXPECT_EQ(tokenizer->encode("Hi\n\xc3\xa9"), (std::vector<int32_t>{72, 105, 10, 0xc3, 0xa9}));
  EXPECT_TRUE(tokenizer->encode("").empty());
}

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const auto tokenizer = make_tokenizer("byte");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::vector<int32_t> ids = tokenizer->encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tokenizer->decode(ids), all);
}

TEST(ByteTokenizer, DecodeRejectsIdsOutsideAByte) {
  const auto tokenizer = make_tokenizer("byte");
  const std::vector<int32_t> too_big = {65, 256};
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(tokenizer->decode(too_big), Error);
  EXPECT_THROW(tokenizer->decode(negative), Error);
}

}  // namespace
}  // namespace shardlm
