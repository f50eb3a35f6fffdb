// RMSNorm (rmsnorm.hpp) against a naive double implementation written here, element
// by element within bounds derived from fp32's rounding (below), on odd shapes: 37 rows,
// dim 40, 576 and 1000 (not multiples of 16), and per-head normalization inside a
// strided qkv row (Qwen3's q_norm / k_norm: 6 and 2 heads of 24 in rows of 240); the
// naive backward checked by finite differences; compute-type inputs and outputs; the
// weight gradient independent of the thread count.
//
// Bounds (u = 2^-24; a sum of n terms off by at most lambda sqrt(n) u sum |terms|,
// lambda = 6, Higham & Mary's probabilistic bound):
//   rstd: the mean of squares off by lambda sqrt(dim) u (relative), then the division,
//     the eps add, sqrt and 1/x: e_r = lambda sqrt(dim) u / 2 + 4u relative.
//   y = x rstd w: |dy| <= |y| (e_r + 2u).
//   dx = r g - x r^3 S / dim (g = dy w, S = sum g x): |d dx| <= (|r g| + 3 |x r^3 S / dim|)
//     (e_r + 5u) + |x| r^3 lambda sqrt(dim) u sum |g x| / dim.
//   dw = sum dy x r in double: |d dw| <= (e_r + u) sum |dy x r| + u |dw|.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/rmsnorm.hpp"
#include "shardlm/core/error.hpp"
#include "kernel_test_helpers.hpp"
#include "relative_error.hpp"

namespace {

using namespace kernel_test;
using shardlm::ConstTypedPtr;
using shardlm::DType;
using shardlm::TypedPtr;
using shardlm::cpu::RmsNormShape;

constexpr double u = 0x1p-24, lambda = 6.0;
constexpr float kEps = 1e-6f;

// Where the vectors lie: `shape`, rows `ld` apart, the first at `offset`.
struct Layout {
  RmsNormShape shape;
  int64_t ld;
  int64_t offset;
  size_t size() const { return static_cast<size_t>(shape.rows * ld); }
  size_t at(int64_t r, int h, int c) const {
    return static_cast<size_t>(offset + r * ld + static_cast<int64_t>(h) * shape.dim + c);
  }
};

struct Reference {
  DVec y, y_bound, rstd, rstd_bound, dx, dx_bound, dw, dw_bound;
};

// Naive double RMSNorm forward and backward over the layout's vectors; y and dx outside
// them are 0.
Reference reference(const DVec& x, const DVec& w, const DVec& dy, const Layout& l, double eps) {
  const RmsNormShape& s = l.shape;
  const int D = s.dim;
  const double e_r = lambda * std::sqrt(double(D)) * u / 2 + 4 * u;
  Reference ref;
  ref.y.assign(x.size(), 0.0);
  ref.y_bound.assign(x.size(), 0.0);
  ref.dx.assign(x.size(), 0.0);
  ref.dx_bound.assign(x.size(), 0.0);
  ref.dw.assign(static_cast<size_t>(D), 0.0);
  ref.dw_bound.assign(static_cast<size_t>(D), 0.0);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int h = 0; h < s.heads; ++h) {
      double ms = 0.0;
      for (int c = 0; c < D; ++c) ms += x[l.at(r, h, c)] * x[l.at(r, h, c)];
      const double rstd = 1.0 / std::sqrt(ms / D + eps);
      ref.rstd.push_back(rstd);
      ref.rstd_bound.push_back(rstd * e_r);
      double S = 0.0, S_mag = 0.0;
      for (int c = 0; c < D; ++c) {
        const size_t i = l.at(r, h, c);
        ref.y[i] = x[i] * rstd * w[static_cast<size_t>(c)];
        ref.y_bound[i] = std::fabs(ref.y[i]) * (e_r + 2 * u);
        S += dy[i] * w[static_cast<size_t>(c)] * x[i];
        S_mag += std::fabs(dy[i] * w[static_cast<size_t>(c)] * x[i]);
      }
      const double r3 = rstd * rstd * rstd;
      for (int c = 0; c < D; ++c) {
        const size_t i = l.at(r, h, c);
        const double g = dy[i] * w[static_cast<size_t>(c)];
        ref.dx[i] = rstd * g - x[i] * r3 * S / D;
        ref.dx_bound[i] = (std::fabs(rstd * g) + 3 * std::fabs(x[i] * r3 * S / D)) * (e_r + 5 * u) +
                          std::fabs(x[i]) * r3 * lambda * std::sqrt(double(D)) * u * S_mag / D;
        ref.dw[static_cast<size_t>(c)] += dy[i] * x[i] * rstd;
        ref.dw_bound[static_cast<size_t>(c)] += std::fabs(dy[i] * x[i] * rstd) * (e_r + u);
      }
    }
  for (size_t c = 0; c < ref.dw.size(); ++c) ref.dw_bound[c] += u * std::fabs(ref.dw[c]);
  return ref;
}

const Layout kLayouts[] = {
    {{37, 1, 576}, 576, 0},
    {{37, 1, 40}, 40, 0},
    {{37, 1, 1000}, 1003, 0},
    {{37, 6, 24}, 240, 0},       // q_norm: 6 q heads of a row with 2 kv heads
    {{37, 2, 24}, 240, 6 * 24},  // k_norm: the 2 k heads after them
};

std::string describe(const Layout& l) {
  return "rows " + std::to_string(l.shape.rows) + " heads " + std::to_string(l.shape.heads) +
         " dim " + std::to_string(l.shape.dim) + " ld " + std::to_string(l.ld);
}

// Inputs of a layout: x off-centre, weights near 1, dy.
struct Inputs {
  Vec x, w, dy;
};
Inputs inputs(const Layout& l, uint64_t seed) {
  return {random_vec(l.size(), seed, 2.0, 0.3),
          random_vec(static_cast<size_t>(l.shape.dim), seed + 1, 0.2, 1.0),
          random_vec(l.size(), seed + 2)};
}

TEST(RmsNorm, ForwardMatchesNaiveDoubleInEveryComputeType) {
  uint64_t seed = 10;
  for (const Layout& l : kLayouts) {
    const RmsNormShape& s = l.shape;
    const auto [x, w, dy] = inputs(l, seed += 3);
    const Reference want = reference(to_double(x), to_double(w), DVec(x.size(), 0.0), l, kEps);
    const std::string what = describe(l);

    Vec y = x, rstd(static_cast<size_t>(s.rows * s.heads));  // outside the vectors: x
    shardlm::cpu::rmsnorm_forward(y.data() + l.offset, l.ld, rstd.data(), x.data() + l.offset,
                                  l.ld, w.data(), s, kEps);
    DVec y_want = want.y;
    for (size_t i = 0; i < x.size(); ++i)
      if (want.y_bound[i] == 0.0 && want.y[i] == 0.0) y_want[i] = x[i];  // untouched
    EXPECT_EQ(count_outside(y, y_want, want.y_bound, "y " + what), 0);
    EXPECT_EQ(count_outside(rstd, want.rstd, want.rstd_bound, "rstd " + what), 0);
    EXPECT_LT(largest_relative_bound(want.y, want.y_bound), 1e-5);

    Vec in_place = x, rstd2(rstd.size());
    shardlm::cpu::rmsnorm_forward(in_place.data() + l.offset, l.ld, rstd2.data(),
                                  in_place.data() + l.offset, l.ld, w.data(), s, kEps);
    EXPECT_EQ(in_place, y) << what;

    for (const DType type : {DType::bf16, DType::fp16}) {
      const std::string typed = std::string(shardlm::dtype_name(type)) + " " + what;
      // y in the compute type: the fp32 result rounded once.
      Half y16 = to_half(type, x);
      shardlm::cpu::rmsnorm_forward(TypedPtr(y16.data() + l.offset, type), l.ld, rstd2.data(),
                                    x.data() + l.offset, l.ld, w.data(), s, kEps);
      EXPECT_EQ(y16, to_half(type, y)) << typed;
      // x stored in the compute type: the fp32 kernel on the widened values.
      const Half x16 = to_half(type, x);
      const Vec x_wide = widen(type, x16);
      Vec from16 = x_wide, from_wide = x_wide, rstd16(rstd.size()), rstd_wide(rstd.size());
      shardlm::cpu::rmsnorm_forward(from16.data() + l.offset, l.ld, rstd16.data(),
                                    ConstTypedPtr(x16.data() + l.offset, type), l.ld, w.data(), s,
                                    kEps);
      shardlm::cpu::rmsnorm_forward(from_wide.data() + l.offset, l.ld, rstd_wide.data(),
                                    x_wide.data() + l.offset, l.ld, w.data(), s, kEps);
      EXPECT_EQ(from16, from_wide) << typed;
      EXPECT_EQ(rstd16, rstd_wide) << typed;
    }
  }
}

TEST(RmsNorm, ResidualFusedForwardIsTheSumThenTheNorm) {
  const int64_t N = 37;
  const int C = 200;
  const Vec a = random_vec(N * C, 1), b = random_vec(N * C, 2), bias = random_vec(C, 3, 0.1);
  const Vec w = random_vec(C, 4, 0.2, 1.0);
  for (const float* branch_bias : {bias.data(), static_cast<const float*>(nullptr)}) {
    Vec residual(N * C), y(N * C), rstd(N);
    shardlm::cpu::residual_rmsnorm_forward(residual.data(), y.data(), rstd.data(), a.data(),
                                           b.data(), branch_bias, w.data(), N, C, kEps);
    Vec want_residual(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(n * C + c);
        const float add = branch_bias != nullptr ? bias[static_cast<size_t>(c)] : 0.0f;
        want_residual[i] = a[i] + b[i] + add;
      }
    EXPECT_EQ(residual, want_residual);
    Vec want_y(N * C), want_rstd(N);
    shardlm::cpu::rmsnorm_forward(want_y.data(), C, want_rstd.data(), want_residual.data(), C,
                                  w.data(), {N, 1, C}, kEps);
    EXPECT_EQ(y, want_y);
    EXPECT_EQ(rstd, want_rstd);
  }
}

TEST(RmsNorm, NaiveBackwardMatchesFiniteDifferences) {
  const Layout l{{3, 2, 5}, 13, 1};
  const DVec x = to_double(random_vec(l.size(), 30, 1.5, 0.2));
  const DVec w = to_double(random_vec(5, 31, 0.3, 1.0));
  const DVec g = to_double(random_vec(l.size(), 32));
  const Reference want = reference(x, w, g, l, kEps);
  auto loss = [&](const DVec& xv, const DVec& wv) {
    return dot(g, reference(xv, wv, g, l, kEps).y);
  };
  DVec fd_x = finite_difference([&](const DVec& v) { return loss(v, w); }, x);
  EXPECT_LT(relative_to_max_error(want.dx, fd_x), 1e-8);
  DVec fd_w = finite_difference([&](const DVec& v) { return loss(x, v); }, w);
  EXPECT_LT(relative_to_max_error(want.dw, fd_w), 1e-8);
}

TEST(RmsNorm, BackwardMatchesNaiveDoubleWithinTheBound) {
  uint64_t seed = 50;
  for (const Layout& l : kLayouts) {
    const RmsNormShape& s = l.shape;
    const auto [x, w, dy] = inputs(l, seed += 3);
    const Reference want = reference(to_double(x), to_double(w), to_double(dy), l, kEps);
    const std::string what = describe(l);
    Vec y(l.size()), rstd(static_cast<size_t>(s.rows * s.heads));
    shardlm::cpu::rmsnorm_forward(y.data() + l.offset, l.ld, rstd.data(), x.data() + l.offset,
                                  l.ld, w.data(), s, kEps);

    // Overwriting dx (what lies outside the vectors stays), accumulating dw.
    const Vec prefill = random_vec(l.size(), ++seed);
    Vec dx = prefill, dw(static_cast<size_t>(s.dim), 0.5f);
    shardlm::cpu::rmsnorm_backward(dx.data() + l.offset, l.ld, dw.data(), dy.data() + l.offset,
                                   l.ld, x.data() + l.offset, l.ld, w.data(), rstd.data(), s,
                                   false);
    DVec dx_want = want.dx;
    for (size_t i = 0; i < dx.size(); ++i)
      if (want.dx_bound[i] == 0.0 && want.dx[i] == 0.0) dx_want[i] = prefill[i];
    EXPECT_EQ(count_outside(dx, dx_want, want.dx_bound, "dx " + what), 0);
    DVec dw_grown(dw.size());
    for (size_t c = 0; c < dw.size(); ++c) dw_grown[c] = double(dw[c]) - 0.5;
    DVec dw_bound = want.dw_bound;  // the += onto 0.5 rounds once more
    for (size_t c = 0; c < dw_bound.size(); ++c) dw_bound[c] += u * (0.5 + std::fabs(want.dw[c]));
    EXPECT_EQ(count_outside(dw_grown, want.dw, dw_bound, "dw " + what), 0);
    EXPECT_LT(largest_relative_bound(want.dx, want.dx_bound), 1e-4);

    // Accumulating dx: the overwritten result added to what was there.
    Vec dx_acc = prefill, dw2(dw.size(), 0.0f);
    shardlm::cpu::rmsnorm_backward(dx_acc.data() + l.offset, l.ld, dw2.data(),
                                   dy.data() + l.offset, l.ld, x.data() + l.offset, l.ld, w.data(),
                                   rstd.data(), s, true);
    DVec acc_want = to_double(prefill), acc_bound(prefill.size(), 0.0);
    for (size_t i = 0; i < dx.size(); ++i) {
      acc_want[i] += want.dx[i];
      acc_bound[i] = want.dx_bound[i] + u * (std::fabs(prefill[i]) + std::fabs(want.dx[i]));
    }
    EXPECT_EQ(count_outside(dx_acc, acc_want, acc_bound, "accumulated dx " + what), 0);

    // x stored in bf16: the fp32 backward on the widened values.
    const Half x16 = to_half(DType::bf16, x);
    const Vec x_wide = widen(DType::bf16, x16);
    Vec dx16(l.size(), 0.0f), dx_wide(l.size(), 0.0f), dw16(dw.size(), 0.0f),
        dw_wide(dw.size(), 0.0f);
    shardlm::cpu::rmsnorm_backward(dx16.data() + l.offset, l.ld, dw16.data(), dy.data() + l.offset,
                                   l.ld, ConstTypedPtr(x16.data() + l.offset, DType::bf16), l.ld,
                                   w.data(), rstd.data(), s, false);
    shardlm::cpu::rmsnorm_backward(dx_wide.data() + l.offset, l.ld, dw_wide.data(),
                                   dy.data() + l.offset, l.ld, x_wide.data() + l.offset, l.ld,
                                   w.data(), rstd.data(), s, false);
    EXPECT_EQ(dx16, dx_wide) << what;
    EXPECT_EQ(dw16, dw_wide) << what;
  }
}

TEST(RmsNorm, GradientsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  const Layout l{{300, 2, 24}, 100, 4};  // 600 vectors: three chunks of the dw sum
  const Vec x = random_vec(l.size(), 70), dy = random_vec(l.size(), 71);
  const Vec w = random_vec(24, 72, 0.2, 1.0);
  Vec rstd(600), y(l.size());
  shardlm::cpu::rmsnorm_forward(y.data() + l.offset, l.ld, rstd.data(), x.data() + l.offset, l.ld,
                                w.data(), l.shape, kEps);
  std::vector<Vec> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Vec dx(l.size(), 0.0f), dw(24, 0.0f);
    shardlm::cpu::rmsnorm_backward(dx.data() + l.offset, l.ld, dw.data(), dy.data() + l.offset,
                                   l.ld, x.data() + l.offset, l.ld, w.data(), rstd.data(),
                                   l.shape, true);
    results.push_back(dx);
    results.push_back(dw);
  }
  omp_set_num_threads(saved);
  for (size_t k = 2; k < results.size(); ++k) EXPECT_EQ(results[k], results[k % 2]);
}

TEST(RmsNorm, RejectsBadShapes) {
  Vec buf(256), rstd(16);
  EXPECT_THROW(shardlm::cpu::rmsnorm_forward(buf.data(), 8, rstd.data(), buf.data(), 8, buf.data(),
                                             {2, 1, 0}, kEps),
               shardlm::Error);
  EXPECT_THROW(shardlm::cpu::rmsnorm_forward(buf.data(), 8, rstd.data(), buf.data(), 8, buf.data(),
                                             {2, 2, 8}, kEps),  // ld 8 < 2 heads of 8
               shardlm::Error);
  EXPECT_THROW(shardlm::cpu::rmsnorm_backward(buf.data(), 16, buf.data(), buf.data(), 16,
                                              buf.data(), 4, buf.data(), rstd.data(), {2, 2, 4},
                                              false),
               shardlm::Error);
}

}  // namespace
