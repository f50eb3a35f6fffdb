// The vectorized AdamW step and gradient sum of squares against scalar references
// written here. AdamW evaluates the update of adamw.hpp in a fixed order with explicit
// fused multiply-adds (adamw.cpp), in its vector path and its scalar tail alike, so
// the comparison with that formula is bitwise (test_adamw.cpp checks the formula
// against double precision); lengths are odd on purpose so vector bodies, scalar
// tails, thread blocks and decay-range boundaries all fall mid-vector.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "shardlm/core/rng.hpp"
#include "shardlm/optim/adamw.hpp"

namespace {

using shardlm::AdamWConfig;
using shardlm::ElementRange;

std::vector<float> random_vec(int64_t n, uint64_t seed, double scale) {
  shardlm::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

TEST(AdamWVectorized, BitwiseEqualToTheScalarFormula) {
  const AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  const float lr = 3e-3f, mult = 0.37f;
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{1000}, int64_t{40007}}) {
    std::vector<float> p = random_vec(n, 10 + n, 1.0), m(static_cast<size_t>(n), 0.0f);
    std::vector<float> v(static_cast<size_t>(n), 0.0f);
    std::vector<float> rp = p, rm = m, rv = v;
    const std::vector<ElementRange> decay = {{n / 7, n / 3}, {n / 2 + 3, n}};
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = random_vec(n, 100 * step + n, 1e-2);
      shardlm::adamw_update(p.data(), g.data(), m.data(), v.data(), n, decay, lr, mult, step, cfg);
      // The update in float, multiply-adds fused where adamw.cpp fuses them.
      const double bias1 = 1.0 - std::pow(double{cfg.beta1}, double(step));
      const double bias2 = 1.0 - std::pow(double{cfg.beta2}, double(step));
      const float step_size = static_cast<float>(lr / bias1);
      const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
      for (int64_t i = 0; i < n; ++i) {
        bool decayed = false;
        for (const auto& r : decay) decayed |= i >= r.begin && i < r.end;
        const float decay_factor = decayed ? 1.0f - lr * cfg.weight_decay : 1.0f;
        const size_t k = static_cast<size_t>(i);
        const float gi = g[k] * mult;
        const float pi = rp[k] * decay_factor;
        const float mi = std::fma(cfg.beta1, rm[k], (1.0f - cfg.beta1) * gi);
        const float vi = std::fma(cfg.beta2, rv[k], ((1.0f - cfg.beta2) * gi) * gi);
        rm[k] = mi;
        rv[k] = vi;
        const float denom = std::sqrt(vi) / bias2_sqrt + cfg.eps;
        rp[k] = std::fma(-step_size, mi / denom, pi);
      }
    }
    EXPECT_EQ(p, rp) << "n=" << n;
    EXPECT_EQ(m, rm) << "n=" << n;
    EXPECT_EQ(v, rv) << "n=" << n;
  }
}

TEST(SumOfSquares, MatchesLongDoubleAndDoesNotDependOnThreads) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{100003}}) {
    const std::vector<float> g = random_vec(n, 7 + n, 3.0);
    long double want = 0.0L;
    for (float x : g) want += static_cast<long double>(x) * x;
    const double got = shardlm::sum_of_squares(g.data(), n);
    EXPECT_NEAR(got, static_cast<double>(want), 1e-13 * static_cast<double>(want)) << "n=" << n;
    // Thread counts set here, not taken from the environment (ctest runs these with
    // OMP_NUM_THREADS=1, which would make a comparison with "the default" vacuous).
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const double one_thread = shardlm::sum_of_squares(g.data(), n);
    EXPECT_EQ(got, one_thread) << "n=" << n;
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      EXPECT_EQ(shardlm::sum_of_squares(g.data(), n), one_thread) << "n=" << n << " threads=" << threads;
    }
    omp_set_num_threads(saved);
  }
}

}  // namespace
