// The rank-order reduction against a naive scalar loop, and proof that the order is
// the documented one (inputs chosen so other orders give other floats).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "shardlm/comm/reduce_kernels.hpp"
#include "shardlm/core/rng.hpp"

namespace shardlm {
namespace {

std::vector<std::vector<float>> random_inputs(int ranks, size_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> inputs(ranks, std::vector<float>(count));
  for (auto& v : inputs)
    for (auto& x : v) x = static_cast<float>(rng.normal() * std::pow(10.0, rng.below(7) - 3.0));
  return inputs;
}

float naive(const std::vector<std::vector<float>>& inputs, size_t i, ReduceOp op) {
  float acc = inputs[0][i];
  for (size_t r = 1; r < inputs.size(); ++r) {
    const float x = inputs[r][i];
    if (op == ReduceOp::sum) acc = acc + x;
    if (op == ReduceOp::max) acc = x > acc ? x : acc;
    if (op == ReduceOp::min) acc = x < acc ? x : acc;
  }
  return acc;
}

TEST(ReduceKernels, MatchesScalarLeftToRightLoopBitwise) {
  for (int ranks : {1, 2, 3, 4, 7}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{17}, size_t{2048}, size_t{5001}}) {
      auto inputs = random_inputs(ranks, count, 1000 + ranks * 31 + count);
      std::vector<const float*> pointers;
      for (auto& v : inputs) pointers.push_back(v.data());
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        std::vector<float> out(count, -1.0f);
        reduce_in_rank_order(pointers.data(), ranks, out.data(), count, op);
        for (size_t i = 0; i < count; ++i) {
          const float expected = naive(inputs, i, op);
          ASSERT_EQ(0, std::memcmp(&out[i], &expected, sizeof(float)))
              << "ranks " << ranks << " count " << count << " op " << to_string(op) << " i " << i;
        }
      }
    }
  }
}

TEST(ReduceKernels, SumsInRankOrderNotAnyOther) {
  // (1e8 + 1) - 1e8 == 0 in float, while (1e8 - 1e8) + 1 == 1: only left to right in
  // rank order gives 0 for element 0 and 1 for element 1.
  std::vector<float> r0 = {1e8f, 1e8f};
  std::vector<float> r1 = {1.0f, -1e8f};
  std::vector<float> r2 = {-1e8f, 1.0f};
  const float* inputs[] = {r0.data(), r1.data(), r2.data()};
  std::vector<float> out(2);
  reduce_in_rank_order(inputs, 3, out.data(), 2, ReduceOp::sum);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 1.0f);
}

TEST(ReduceKernels, InPlaceOutputMayBeAnyOneInput) {
  const size_t count = 4099;  // crosses the kernel's tile boundary
  for (int in_place_rank = 0; in_place_rank < 3; ++in_place_rank) {
    auto inputs = random_inputs(3, count, 77 + in_place_rank);
    std::vector<float> expected(count);
    for (size_t i = 0; i < count; ++i) expected[i] = naive(inputs, i, ReduceOp::sum);
    const float* pointers[] = {inputs[0].data(), inputs[1].data(), inputs[2].data()};
    float* out = inputs[in_place_rank].data();
    reduce_in_rank_order(pointers, 3, out, count, ReduceOp::sum);
    EXPECT_EQ(0, std::memcmp(out, expected.data(), count * sizeof(float))) << in_place_rank;
  }
}

TEST(ReduceKernels, GatheredLayoutForFloatDoubleAndInt64) {
  const int ranks = 3;
  const size_t count = 5;
  std::vector<float> f(ranks * count);
  std::vector<double> d(ranks * count);
  std::vector<int64_t> n(ranks * count);
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < count; ++i) {
      f[r * count + i] = static_cast<float>((r + 1) * 10 + i);
      d[r * count + i] = (r + 1) * 0.25 + static_cast<double>(i);
      n[r * count + i] = (r == 1 ? -1 : 1) * static_cast<int64_t>((r + 1) * 1000000000000LL + i);
    }
  std::vector<float> fo(count);
  std::vector<double> dout(count);
  std::vector<int64_t> nmax(count);
  std::vector<int64_t> nmin(count);
  reduce_gathered(f.data(), ranks, count, fo.data(), ReduceOp::sum);
  reduce_gathered(d.data(), ranks, count, dout.data(), ReduceOp::sum);
  reduce_gathered(n.data(), ranks, count, nmax.data(), ReduceOp::max);
  reduce_gathered(n.data(), ranks, count, nmin.data(), ReduceOp::min);
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(fo[i], 60.0f + 3 * i);
    EXPECT_EQ(dout[i], 1.5 + 3.0 * i);
    EXPECT_EQ(nmax[i], 3000000000000LL + static_cast<int64_t>(i));
    EXPECT_EQ(nmin[i], -2000000000000LL - static_cast<int64_t>(i));
  }
}

}  // namespace
}  // namespace shardlm
