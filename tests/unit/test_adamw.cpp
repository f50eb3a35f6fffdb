// AdamW and the LR schedule against naive double-precision references written from
// the PyTorch documentation's update rule.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "shardlm/core/rng.hpp"
#include "shardlm/optim/adamw.hpp"
#include "shardlm/optim/lr_schedule.hpp"

using namespace shardlm;

TEST(AdamW, MatchesNaiveReferenceOverSeveralSteps) {
  const int64_t n = 1000;
  Rng rng(7);
  std::vector<float> p(n), m(n, 0), v(n, 0);
  std::vector<double> rp(n), rm(n, 0), rv(n, 0);
  for (int64_t i = 0; i < n; ++i) rp[i] = p[i] = static_cast<float>(rng.normal());
  std::vector<ElementRange> decay = {{100, 300}, {500, 1000}};
  AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  const float lr = 1e-2f, mult = 0.5f;
  for (int step = 1; step <= 5; ++step) {
    std::vector<float> g(n);
    for (auto& x : g) x = static_cast<float>(rng.normal());
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, decay, lr, mult, step, cfg);
    for (int64_t i = 0; i < n; ++i) {
      bool decayed = (i >= 100 && i < 300) || i >= 500;
      double gi = static_cast<double>(g[i]) * mult;
      if (decayed) rp[i] *= 1.0 - lr * 0.1;
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.95 * rv[i] + 0.05 * gi * gi;
      double mhat = rm[i] / (1 - std::pow(0.9, step));
      double vhat = rv[i] / (1 - std::pow(0.95, step));
      rp[i] -= lr * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(p[i], rp[i], 1e-5 * (1 + std::fabs(rp[i]))) << i;
}

TEST(AdamW, WeightDecayRangesFollowParameters) {
  ModelConfig c = model_preset("gpt2-tiny");
  c.vocab_size = 256;
  ParamLayout layout = ParamLayout::build(c, 2);
  const auto& block = layout.units[1];
  const int64_t S = block.shard_numel(2);
  for (int r = 0; r < 2; ++r) {
    auto ranges = weight_decay_ranges(block, r * S, (r + 1) * S);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t e = r * S + i;
      bool expected = false;
      for (const auto& p : block.params)
        if (p.weight_decay && e >= p.offset && e < p.offset + p.numel) expected = true;
      bool got = false;
      for (const auto& rg : ranges)
        if (i >= rg.begin && i < rg.end) got = true;
      ASSERT_EQ(got, expected) << "rank " << r << " element " << e;
    }
  }
}

TEST(AdamW, SumOfSquaresIndependentOfThreadsAndClipMultiplier) {
  std::vector<float> x(100003);
  Rng rng(3);
  double ref = 0;
  for (auto& v : x) {
    v = static_cast<float>(rng.normal());
    ref += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(sum_of_squares(x.data(), static_cast<int64_t>(x.size())), ref, 1e-9 * ref);
  EXPECT_FLOAT_EQ(clip_multiplier(0.5, 1.0f), 1.0f);
  EXPECT_NEAR(clip_multiplier(4.0, 1.0f), 0.25f, 1e-6);
  EXPECT_FLOAT_EQ(clip_multiplier(1e9, 0.0f), 1.0f);  // clipping disabled
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{1.0f, 0.1f, 10, 111};
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(9), 1.0f);
  EXPECT_FLOAT_EQ(s.at(10), 1.0f);
  EXPECT_NEAR(s.at(60), 0.55f, 1e-6);  // halfway: (max+min)/2
  EXPECT_NEAR(s.at(110), 0.1f, 1e-6);
  for (int i = 11; i < 111; ++i) EXPECT_LE(s.at(i), s.at(i - 1));
}
