// SFT batching: padded and packed rows from an SFT example file — targets from the
// mask, positions restarting per example, key_begin at each example's start,
// padding, next-fit packing, long examples cut, epochs shuffled by seed only,
// rows split over ranks like BatchSampler's samples, and every example's
// (input, target, position) triples the same packed as padded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "shardlm/core/error.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/data/sft_sampler.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

struct Rows {
  explicit Rows(int64_t rows, int T) : tokens(rows * T), targets(rows * T), positions(rows * T), key_begin(rows * T) {}
  SftBatch batch() { return {tokens.data(), targets.data(), positions.data(), key_begin.data()}; }
  std::vector<int32_t> tokens, targets, positions, key_begin;
};

class SftSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("shardlm_sft_sampler_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".sft"))
                .string();
  }
  void TearDown() override { fs::remove(path_); }
  // Example e: tokens 10*(e+1) + i (i < length), mask 1 on every second token from index 1.
  SftExampleFile write(const std::vector<int>& lengths) {
    SftExamples examples;
    for (size_t e = 0; e < lengths.size(); ++e) {
      std::vector<int32_t> ids;
      std::vector<uint8_t> mask;
      for (int i = 0; i < lengths[e]; ++i) {
        ids.push_back(static_cast<int32_t>(1000 * (e + 1) + i));
        mask.push_back(i % 2 == 1);
      }
      examples.add(ids, mask);
    }
    SftExampleFileWriter(path_, 100000, examples).commit();
    return SftExampleFile(path_);
  }
  std::string path_;
};

TEST_F(SftSamplerTest, PaddedRowHoldsOneExampleThenPadding) {
  const SftExampleFile file = write({4, 9});
  SftSampler sampler(file, {.seq_len = 6, .batching = SftBatching::padded, .seed = 1, .shuffle = false,
                            .pad_token = 7});
  Rows rows(2, 6);
  const int64_t targets = sampler.fill_batch(0, 2, rows.batch());
  // Example 0: tokens 1000..1003 -> inputs 1000, 1001, 1002; targets 1001 (mask 1), -1 (1002 mask 0), 1003.
  EXPECT_EQ(std::vector<int32_t>(rows.tokens.begin(), rows.tokens.begin() + 6),
            (std::vector<int32_t>{1000, 1001, 1002, 7, 7, 7}));
  EXPECT_EQ(std::vector<int32_t>(rows.targets.begin(), rows.targets.begin() + 6),
            (std::vector<int32_t>{1001, -1, 1003, -1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(rows.positions.begin(), rows.positions.begin() + 6),
            (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(rows.key_begin.begin(), rows.key_begin.begin() + 6),
            (std::vector<int32_t>{0, 0, 0, 3, 3, 3}));
  // Example 1 has 9 tokens: 8 positions cut to the row's 6 (inputs 2000..2005, targets 2001..2006).
  EXPECT_EQ(std::vector<int32_t>(rows.tokens.begin() + 6, rows.tokens.end()),
            (std::vector<int32_t>{2000, 2001, 2002, 2003, 2004, 2005}));
  EXPECT_EQ(std::vector<int32_t>(rows.targets.begin() + 6, rows.targets.end()),
            (std::vector<int32_t>{2001, -1, 2003, -1, 2005, -1}));
  EXPECT_EQ(targets, 2 + 3);
  EXPECT_EQ(sampler.examples_longer_than_row(), 1);
  EXPECT_EQ(sampler.rows_in_epoch(0), 2);
}

TEST_F(SftSamplerTest, PackedRowsAreNextFitWithPerExamplePositions) {
  // Positions per example: 2, 3, 4, 1, 5 with seq_len 6 in file order:
  // row 0 = {0, 1} (5 used, 4 does not fit), row 1 = {2, 3} (5), row 2 = {4} (5).
  const SftExampleFile file = write({3, 4, 5, 2, 6});
  SftSampler sampler(file, {.seq_len = 6, .batching = SftBatching::packed, .seed = 1, .shuffle = false});
  EXPECT_EQ(sampler.rows_in_epoch(0), 3);
  EXPECT_EQ(sampler.examples_of(0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(sampler.examples_of(1), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(sampler.examples_of(2), (std::vector<int64_t>{4}));
  EXPECT_EQ(sampler.examples_of(3), (std::vector<int64_t>{0, 1}));  // epoch 1, same order without shuffle
  Rows rows(1, 6);
  sampler.fill(0, rows.batch(), 0);
  EXPECT_EQ(rows.tokens, (std::vector<int32_t>{1000, 1001, 2000, 2001, 2002, 0}));
  EXPECT_EQ(rows.targets, (std::vector<int32_t>{1001, -1, 2001, -1, 2003, -1}));
  EXPECT_EQ(rows.positions, (std::vector<int32_t>{0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(rows.key_begin, (std::vector<int32_t>{0, 0, 2, 2, 2, 5}));
}

TEST_F(SftSamplerTest, EveryEpochSeesEveryExampleOnceAndOrderDependsOnlyOnSeed) {
  std::vector<int> lengths;
  for (int e = 0; e < 57; ++e) lengths.push_back(2 + (e * 7) % 23);
  const SftExampleFile file = write(lengths);
  for (SftBatching batching : {SftBatching::padded, SftBatching::packed}) {
    SftSampler a(file, {.seq_len = 16, .batching = batching, .seed = 5});
    SftSampler b(file, {.seq_len = 16, .batching = batching, .seed = 5});
    SftSampler c(file, {.seq_len = 16, .batching = batching, .seed = 6});
    bool differs = false;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> seen;
      for (int64_t r = a.rows_before_epoch(epoch); r < a.rows_before_epoch(epoch + 1); ++r) {
        const std::vector<int64_t> examples = a.examples_of(r);
        EXPECT_EQ(examples, b.examples_of(r));
        differs = differs || examples != c.examples_of(r);
        int64_t used = 0;
        for (int64_t e : examples) used += std::min<int64_t>(file.example_length(e) - 1, 16);
        EXPECT_LE(used, 16);
        seen.insert(seen.end(), examples.begin(), examples.end());
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(57);
      for (int64_t i = 0; i < 57; ++i) all[i] = i;
      EXPECT_EQ(seen, all) << "epoch " << epoch;
    }
    EXPECT_TRUE(differs);
    // The padded order is BatchSampler's shuffle of the examples.
    if (batching == SftBatching::padded) {
      std::vector<int64_t> perm(57);
      epoch_permutation(5, 1, perm.data(), 57);
      EXPECT_EQ(a.examples_of(57 + 3), (std::vector<int64_t>{perm[3]}));
    }
  }
}

TEST_F(SftSamplerTest, RanksSplitAStepLikeBatchPartition) {
  std::vector<int> lengths(40, 5);
  const SftExampleFile file = write(lengths);
  SftSampler one(file, {.seq_len = 12, .batching = SftBatching::packed, .seed = 9});
  // Global batch 4, 2 ranks x micro-batch 1: rank r, micro m of step s reads row first_sample(s, r, m).
  const BatchPartition partition(4, 2, 1);
  Rows whole(4, 12), parts(1, 12);
  for (int64_t step = 0; step < 5; ++step) {
    one.fill_batch(step * 4, 4, whole.batch());
    for (int rank = 0; rank < 2; ++rank) {
      SftSampler mine(file, {.seq_len = 12, .batching = SftBatching::packed, .seed = 9});  // each rank's own
      for (int micro = 0; micro < partition.accumulation_steps(); ++micro) {
        const int64_t row = partition.first_sample(step, rank, micro);
        mine.fill(row, parts.batch(), 0);
        const int64_t at = (row - step * 4) * 12;
        EXPECT_TRUE(std::equal(parts.tokens.begin(), parts.tokens.end(), whole.tokens.begin() + at));
        EXPECT_TRUE(std::equal(parts.targets.begin(), parts.targets.end(), whole.targets.begin() + at));
        EXPECT_TRUE(std::equal(parts.key_begin.begin(), parts.key_begin.end(), whole.key_begin.begin() + at));
      }
    }
  }
}

// What an example contributes, as (input, target, position) triples in order.
using Triples = std::vector<std::tuple<int32_t, int32_t, int32_t>>;

std::map<int32_t, Triples> triples_by_example(const Rows& rows, int64_t count, int T) {
  std::map<int32_t, Triples> out;
  for (int64_t r = 0; r < count; ++r)
    for (int t = 0; t < T; ++t) {
      const int64_t i = r * T + t;
      EXPECT_LE(rows.key_begin[i], t);
      EXPECT_EQ(rows.positions[i], t - rows.key_begin[i]);
      const int64_t start = r * T + rows.key_begin[i];
      if (rows.tokens[start] == 0) continue;  // padding
      out[rows.tokens[start] / 1000].emplace_back(rows.tokens[i], rows.targets[i], rows.positions[i]);
    }
  return out;
}

TEST_F(SftSamplerTest, PackedAndPaddedGiveEachExampleTheSameTriples) {
  std::vector<int> lengths;
  for (int e = 0; e < 23; ++e) lengths.push_back(2 + (e * 5) % 13);
  const SftExampleFile file = write(lengths);
  const int T = 14;
  SftSampler padded(file, {.seq_len = T, .batching = SftBatching::padded, .seed = 3});
  SftSampler packed(file, {.seq_len = T, .batching = SftBatching::packed, .seed = 3});
  const int64_t padded_rows = padded.rows_in_epoch(0), packed_rows = packed.rows_in_epoch(0);
  EXPECT_LT(packed_rows, padded_rows);
  Rows a(padded_rows, T), b(packed_rows, T);
  const int64_t targets_a = padded.fill_batch(0, padded_rows, a.batch());
  const int64_t targets_b = packed.fill_batch(0, packed_rows, b.batch());
  EXPECT_EQ(targets_a, targets_b);
  const auto by_example_a = triples_by_example(a, padded_rows, T);
  EXPECT_EQ(by_example_a.size(), 23u);
  EXPECT_EQ(by_example_a, triples_by_example(b, packed_rows, T));
}

TEST_F(SftSamplerTest, BadOptions) {
  const SftExampleFile file = write({3});
  EXPECT_THROW(SftSampler(file, {.seq_len = 0}), Error);
  EXPECT_THROW(SftSampler(file, {.seq_len = 4, .pad_token = 100000}), Error);
  SftSampler ok(file, {.seq_len = 4});
  Rows rows(1, 4);
  EXPECT_THROW(ok.fill(-1, rows.batch(), 0), Error);
}

}  // namespace
}  // namespace shardlm
