// The deterministic sampler: windows, per-epoch shuffles, and how a step's
// global batch is split over ranks and micro-batches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/data/sampler.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

// A token file whose token i is i (mod the vocabulary), so a window's first
// token tells where it starts.
class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardlm_sampler_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  TokenFile make_file(int64_t n_tokens, int64_t vocab = 65536) {
    std::vector<int32_t> tokens(n_tokens);
    for (int64_t i = 0; i < n_tokens; ++i) tokens[i] = static_cast<int32_t>(i % vocab);
    const std::string path = (dir_ / ("tokens_" + std::to_string(n_tokens) + ".bin")).string();
    write_token_file(path, vocab, tokens);
    return TokenFile(path);
  }
  fs::path dir_;
};

TEST_F(SamplerTest, CountsWindowsOfSeqLenPlusOne) {
  EXPECT_EQ(count_windows(make_file(9), 4), 2);   // windows [0,5) and [4,9)
  EXPECT_EQ(count_windows(make_file(12), 4), 2);  // token 12 would be needed for a third
  EXPECT_EQ(count_windows(make_file(13), 4), 3);
  EXPECT_EQ(count_windows(make_file(5), 4), 1);
}

TEST_F(SamplerTest, TooFewTokensNamesTheFileAndTheNeed) {
  const TokenFile file = make_file(4);
  try {
    BatchSampler sampler(file, 4, 1);
    ADD_FAILURE() << "4 tokens cannot make one window of 5";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "data file " + file.path() + " has 4 tokens, fewer than seq_len+1 = 5");
  }
  EXPECT_THROW(EvalSampler(file, 4), Error);
  EXPECT_THROW(BatchSampler(file, 0, 1), Error);
}

TEST_F(SamplerTest, TargetsAreTheInputsShiftedByOne) {
  const TokenFile file = make_file(1000);
  const int seq_len = 16;
  BatchSampler sampler(file, seq_len, 42);
  std::vector<int32_t> tokens(seq_len), targets(seq_len);
  for (int64_t g = 0; g < 200; ++g) {
    sampler.fill(g, tokens.data(), targets.data());
    const int64_t start = sampler.window_of(g) * seq_len;
    for (int i = 0; i < seq_len; ++i) {
      ASSERT_EQ(tokens[i], start + i);
      ASSERT_EQ(targets[i], start + i + 1);
    }
  }
}

TEST_F(SamplerTest, EachEpochVisitsEveryWindowOnceInANewOrder) {
  const TokenFile file = make_file(1 + 37 * 8);
  BatchSampler sampler(file, 8, 7);
  ASSERT_EQ(sampler.num_windows(), 37);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order;
    for (int64_t i = 0; i < 37; ++i) order.push_back(sampler.window_of(epoch * 37 + i));
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(37);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "epoch " << epoch;
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
}

TEST_F(SamplerTest, FollowsTheDocumentedShuffle) {
  // window(g) = perm_{g / n}[g % n]; perm_e = Fisher-Yates (from the top) of
  // 0..n-1 with Rng(splitmix64(splitmix64(seed) ^ e)).
  const TokenFile file = make_file(1 + 50 * 4);
  const uint64_t seed = 1234;
  BatchSampler sampler(file, 4, seed);
  const int64_t n = 50;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    Rng rng(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)));
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sampler.window_of(epoch * n + i), perm[i]) << epoch << " " << i;
  }
}

TEST_F(SamplerTest, SameSeedSameSamplesInAnyAccessOrder) {
  const TokenFile file = make_file(5000);
  BatchSampler in_order(file, 32, 99);
  BatchSampler jumping(file, 32, 99);
  BatchSampler other_seed(file, 32, 100);
  const int64_t n = in_order.num_windows();
  std::vector<int64_t> expected;
  for (int64_t g = 0; g < 4 * n; ++g) expected.push_back(in_order.window_of(g));
  // Backwards and across epoch boundaries, so the cached permutation is rebuilt.
  for (int64_t g = 4 * n - 1; g >= 0; g -= 3) ASSERT_EQ(jumping.window_of(g), expected[g]) << g;
  for (int64_t g : {int64_t{0}, 3 * n, n - 1, n, 2 * n + 5, int64_t{1}}) ASSERT_EQ(jumping.window_of(g), expected[g]) << g;
  int differences = 0;
  for (int64_t g = 0; g < n; ++g) differences += other_seed.window_of(g) != expected[g];
  EXPECT_GT(differences, n / 2);
}

TEST_F(SamplerTest, FillBatchCrossesTheEpochBoundary) {
  const TokenFile file = make_file(1 + 10 * 8);
  BatchSampler sampler(file, 8, 3);
  BatchSampler reference(file, 8, 3);
  std::vector<int32_t> tokens(6 * 8), targets(6 * 8);
  sampler.fill_batch(7, 6, tokens.data(), targets.data());  // samples 7..12: epoch 0 then epoch 1
  for (int64_t i = 0; i < 6; ++i) {
    const int64_t start = reference.window_of(7 + i) * 8;
    EXPECT_EQ(tokens[i * 8], start);
    EXPECT_EQ(targets[i * 8 + 7], start + 8);
  }
}

TEST_F(SamplerTest, EvalSamplerReadsWindowsInOrder) {
  const TokenFile file = make_file(1 + 6 * 10);
  EvalSampler eval(file, 10);
  ASSERT_EQ(eval.num_windows(), 6);
  std::vector<int32_t> tokens(10), targets(10);
  for (int64_t w = 0; w < 6; ++w) {
    eval.fill(w, tokens.data(), targets.data());
    EXPECT_EQ(tokens[0], w * 10);
    EXPECT_EQ(targets[9], w * 10 + 10);
  }
  EXPECT_THROW(eval.fill(6, tokens.data(), targets.data()), Error);
  EXPECT_THROW(eval.fill(-1, tokens.data(), targets.data()), Error);
}

TEST(BatchPartition, RanksSplitTheGlobalBatchExactlyOnce) {
  const int64_t global_batch = 24;
  for (int world_size : {1, 2, 3, 4}) {
    for (int64_t micro_batch : {int64_t{1}, int64_t{2}}) {
      const BatchPartition partition(global_batch, world_size, micro_batch);
      EXPECT_EQ(partition.accumulation_steps(), global_batch / (world_size * micro_batch));
      for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{17}}) {
        std::multiset<int64_t> seen;
        for (int rank = 0; rank < world_size; ++rank) {
          std::vector<int64_t> rank_samples;
          for (int k = 0; k < partition.accumulation_steps(); ++k) {
            const int64_t first = partition.first_sample(step, rank, k);
            for (int64_t i = 0; i < micro_batch; ++i) rank_samples.push_back(first + i);
          }
          // Rank r's micro-batches, in order, are exactly its contiguous slice.
          const int64_t begin = step * global_batch + rank * global_batch / world_size;
          std::vector<int64_t> slice(global_batch / world_size);
          std::iota(slice.begin(), slice.end(), begin);
          EXPECT_EQ(rank_samples, slice) << "N=" << world_size << " b=" << micro_batch << " r=" << rank;
          seen.insert(rank_samples.begin(), rank_samples.end());
        }
        std::multiset<int64_t> expected;
        for (int64_t g = step * global_batch; g < (step + 1) * global_batch; ++g) expected.insert(g);
        EXPECT_EQ(seen, expected) << "N=" << world_size << " b=" << micro_batch;
      }
    }
  }
}

TEST_F(SamplerTest, StepTokensDoNotDependOnWorldSize) {
  const TokenFile file = make_file(3000);
  const int seq_len = 16;
  const int64_t global_batch = 12;
  auto step_rows = [&](int world_size, int64_t micro_batch, int64_t step) {
    BatchSampler sampler(file, seq_len, 5);  // each rank has its own sampler
    const BatchPartition partition(global_batch, world_size, micro_batch);
    std::vector<int32_t> all;
    for (int rank = 0; rank < world_size; ++rank) {
      for (int k = 0; k < partition.accumulation_steps(); ++k) {
        std::vector<int32_t> tokens(micro_batch * seq_len), targets(micro_batch * seq_len);
        sampler.fill_batch(partition.first_sample(step, rank, k), micro_batch, tokens.data(), targets.data());
        all.insert(all.end(), tokens.begin(), tokens.end());
      }
    }
    return all;
  };
  for (int64_t step : {int64_t{0}, int64_t{30}}) {  // 30 * 12 samples > 187 windows: a later epoch
    const std::vector<int32_t> single = step_rows(1, 12, step);
    EXPECT_EQ(step_rows(2, 3, step), single);
    EXPECT_EQ(step_rows(3, 2, step), single);
    EXPECT_EQ(step_rows(4, 1, step), single);
  }
}

TEST(BatchPartition, IndivisibleBatchNamesBothNumbers) {
  try {
    BatchPartition(10, 4, 2);
    ADD_FAILURE() << "10 is not a multiple of 4 x 2";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("global batch 10"), std::string::npos) << message;
    EXPECT_NE(message.find("4 x 2 = 8"), std::string::npos) << message;
  }
  EXPECT_THROW(BatchPartition(0, 1, 1), Error);
  EXPECT_THROW(BatchPartition(8, 0, 1), Error);
  const BatchPartition partition(8, 2, 2);
  EXPECT_THROW(partition.first_sample(0, 2, 0), Error);
  EXPECT_THROW(partition.first_sample(0, 0, 2), Error);
}

}  // namespace
}  // namespace shardlm
