// Rotary position embeddings (rope.hpp) against references written here:
//  - the inverse frequencies against transformers' formula re-derived in long double
//    (default and Llama 3.1 "llama3" scaling, each of its three bands present), and
//    against values transformers 5 printed for Llama 3.2 1B's config;
//  - the forward against the rotation computed directly in long double on odd shapes
//    (37 rows, strided, head_dim 24, 40, 64, 128), fp32 in and out of place and rounded
//    once into bf16 / fp16, within a bound derived from fp32's rounding;
//  - the backward as the transpose: <R x, y> = <x, R^T y>, and element by element
//    against the transposed rotation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/rope.hpp"
#include "shardlm/core/error.hpp"
#include "kernel_test_helpers.hpp"

namespace {

using namespace kernel_test;
using shardlm::DType;
using shardlm::TypedPtr;
using shardlm::RopeScaling;
using shardlm::cpu::RopeTable;

// transformers' inverse frequency i of a head_dim-wide head, in long double, written
// as the count of wavelengths that fit the original context: below low_freq_factor
// the frequency is divided by factor, above high_freq_factor kept, in between
// interpolated linearly in that count.
long double inverse_frequency(int i, int head_dim, long double theta, const RopeScaling& s) {
  const long double f = std::exp(-2.0L * i / head_dim * std::log(theta));
  if (s.type == "default") return f;
  const long double wavelengths_in_context =
      s.original_max_position_embeddings * f / (2 * std::numbers::pi_v<long double>);
  if (wavelengths_in_context < s.low_freq_factor) return f / s.factor;
  if (wavelengths_in_context > s.high_freq_factor) return f;
  const long double t = (wavelengths_in_context - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return f * ((1 - t) / s.factor + t);
}

RopeScaling llama3(double factor) { return {"llama3", factor, 1.0, 4.0, 8192}; }

TEST(Rope, InverseFrequenciesFollowTransformersFormula) {
  struct Config {
    int head_dim;
    double theta;
    RopeScaling scaling;
  };
  const Config configs[] = {{64, 500000.0, llama3(32.0)}, {128, 500000.0, llama3(8.0)},
                            {24, 10000.0, RopeScaling{}}, {128, 1000000.0, RopeScaling{}}};
  for (const Config& c : configs) {
    const std::vector<double> got =
        shardlm::cpu::rope_inverse_frequencies(c.head_dim, c.theta, c.scaling);
    ASSERT_EQ(got.size(), static_cast<size_t>(c.head_dim / 2));
    int scaled = 0, smoothed = 0, kept = 0;
    for (int i = 0; i < c.head_dim / 2; ++i) {
      const long double want = inverse_frequency(i, c.head_dim, c.theta, c.scaling);
      EXPECT_NEAR(got[static_cast<size_t>(i)] / double(want), 1.0, 1e-14)
          << "head_dim " << c.head_dim << " i " << i;
      const long double plain = inverse_frequency(i, c.head_dim, c.theta, RopeScaling{});
      if (want == plain) ++kept;
      else if (std::fabs(double(want * c.scaling.factor / plain) - 1.0) < 1e-15) ++scaled;
      else ++smoothed;
    }
    if (c.scaling.type == "llama3") {  // every band is exercised
      EXPECT_GT(scaled, 0);
      EXPECT_GT(smoothed, 0);
      EXPECT_GT(kept, 0);
    }
  }
}

// inv_freq of Llama 3.2 1B's config (head_dim 64, rope_theta 500000, llama3: factor 32,
// low 1, high 4, original context 8192) as transformers 5's _compute_llama3_parameters
// returned it (fp32), at both ends and through the interpolated band (i = 15..17).
TEST(Rope, InverseFrequenciesMatchTransformersValues) {
  const std::vector<double> got = shardlm::cpu::rope_inverse_frequencies(64, 500000.0, llama3(32));
  const std::pair<int, double> printed[] = {
      {0, 1.0},
      {14, 0.0032114461064338684},
      {15, 0.0012905480107292533},
      {16, 0.000429556705057621},
      {17, 9.708286233944818e-05},
      {18, 1.9461638657958247e-05},
      {31, 9.418306490260875e-08}};
  for (const auto& [i, value] : printed)  // transformers computes in fp32: a few ulp
    EXPECT_NEAR(got[static_cast<size_t>(i)] / value, 1.0, 1e-6) << "i " << i;
}

// The rotation of one head in long double, from the angle itself (not the table).
struct Rotation {
  std::vector<long double> inv_freq;
  int head_dim;
  // y = R(position) x (transpose: R^T).
  std::vector<long double> apply(const float* x, int position, bool transpose) const {
    const int half = head_dim / 2;
    std::vector<long double> y(static_cast<size_t>(head_dim));
    for (int i = 0; i < half; ++i) {
      const long double angle = position * inv_freq[static_cast<size_t>(i)];
      const long double c = std::cos(angle), s = transpose ? -std::sin(angle) : std::sin(angle);
      y[static_cast<size_t>(i)] = x[i] * c - x[i + half] * s;
      y[static_cast<size_t>(i + half)] = x[i + half] * c + x[i] * s;
    }
    return y;
  }
};

Rotation rotation(int head_dim, double theta, const RopeScaling& scaling) {
  Rotation r{{}, head_dim};
  for (int i = 0; i < head_dim / 2; ++i)
    r.inv_freq.push_back(inverse_frequency(i, head_dim, theta, scaling));
  return r;
}

struct Layout {
  int64_t rows;
  int heads, head_dim;
  int64_t ld;  // > heads * head_dim: the gap must stay untouched
};

std::vector<int32_t> random_positions(int64_t rows, int max_positions, uint64_t seed) {
  const Vec u = random_vec(static_cast<size_t>(rows), seed);
  std::vector<int32_t> p;
  for (float x : u) p.push_back(static_cast<int32_t>(std::fabs(x) * 997) % max_positions);
  p[0] = 0;
  p[static_cast<size_t>(rows) - 1] = max_positions - 1;
  return p;
}

// Per element of y = R x (or R^T x): the table's cos and sin are rounded to fp32
// (|error| <= 2^-25 each, as |value| <= 1), and each of the two products and the sum
// rounds once: |error| <= 2^-25 (|x_i| + |x_j|) + 3u (|x_i| + |x_j|) <= 4u (|x_i| + |x_j|).
DVec rotation_bound(const Vec& x, const Layout& l) {
  constexpr double u = 0x1p-24;
  DVec bound(x.size(), 0.0);
  const int half = l.head_dim / 2;
  for (int64_t r = 0; r < l.rows; ++r)
    for (int h = 0; h < l.heads; ++h) {
      const size_t base = static_cast<size_t>(r * l.ld + h * l.head_dim);
      for (int i = 0; i < half; ++i) {
        const double b = 4 * u * (std::fabs(x[base + i]) + std::fabs(x[base + i + half]));
        bound[base + i] = bound[base + i + half] = b;
      }
    }
  return bound;
}

DVec direct(const Vec& x, const Layout& l, const std::vector<int32_t>& positions,
            const Rotation& rot, bool transpose) {
  DVec y = to_double(x);  // the gap between rows is carried over
  for (int64_t r = 0; r < l.rows; ++r)
    for (int h = 0; h < l.heads; ++h) {
      const size_t base = static_cast<size_t>(r * l.ld + h * l.head_dim);
      const auto head = rot.apply(x.data() + base, positions[static_cast<size_t>(r)], transpose);
      for (int d = 0; d < l.head_dim; ++d) y[base + d] = double(head[static_cast<size_t>(d)]);
    }
  return y;
}

const RopeScaling kLlama3 = llama3(8.0);
constexpr int kMaxPositions = 9000;  // past the original context: scaled frequencies turn

TEST(Rope, ForwardMatchesTheDirectRotation) {
  for (const int head_dim : {24, 40, 64, 128}) {
    const Layout l{37, 3, head_dim, 3 * head_dim + 5};
    const RopeTable table(head_dim, kMaxPositions, 500000.0, kLlama3);
    const Rotation rot = rotation(head_dim, 500000.0, kLlama3);
    const std::vector<int32_t> positions = random_positions(l.rows, kMaxPositions, head_dim);
    const Vec x = random_vec(static_cast<size_t>(l.rows * l.ld), 10 + head_dim);
    const DVec want = direct(x, l, positions, rot, false);
    const DVec bound = rotation_bound(x, l);
    const std::string what = "head_dim " + std::to_string(head_dim);

    Vec y = x;  // the gap keeps x's values
    shardlm::cpu::rope_forward(y.data(), l.ld, x.data(), l.ld, l.rows, l.heads, head_dim,
                               positions.data(), table);
    EXPECT_EQ(count_outside(y, want, bound, "fp32 " + what), 0);
    Vec in_place = x;
    shardlm::cpu::rope_forward(in_place.data(), l.ld, in_place.data(), l.ld, l.rows, l.heads,
                               head_dim, positions.data(), table);
    EXPECT_EQ(in_place, y) << what;

    for (const DType type : {DType::bf16, DType::fp16}) {
      Half stored = to_half(type, x);
      shardlm::cpu::rope_forward(TypedPtr(stored.data(), type), l.ld, x.data(), l.ld, l.rows,
                                 l.heads, head_dim, positions.data(), table);
      EXPECT_EQ(stored, to_half(type, y)) << what;  // the fp32 result rounded once
      DVec typed_bound = bound;
      for (size_t i = 0; i < bound.size(); ++i)
        typed_bound[i] += unit_roundoff(type) * std::fabs(want[i]);
      EXPECT_EQ(count_outside(widen(type, stored), want, typed_bound,
                              std::string(shardlm::dtype_name(type)) + " " + what),
                0);
    }
  }
}

TEST(Rope, BackwardIsTheTranspose) {
  for (const int head_dim : {24, 40, 64, 128}) {
    const Layout l{37, 2, head_dim, 2 * head_dim + 3};
    const RopeTable table(head_dim, kMaxPositions, 10000.0, RopeScaling{});
    const std::vector<int32_t> positions = random_positions(l.rows, kMaxPositions, 7 + head_dim);
    const Vec x = random_vec(static_cast<size_t>(l.rows * l.ld), 20 + head_dim);
    const Vec dy = random_vec(x.size(), 30 + head_dim);
    Vec rx = x, rt_dy = dy;
    shardlm::cpu::rope_forward(rx.data(), l.ld, x.data(), l.ld, l.rows, l.heads, head_dim,
                               positions.data(), table);
    shardlm::cpu::rope_backward(rt_dy.data(), l.ld, dy.data(), l.ld, l.rows, l.heads, head_dim,
                                positions.data(), table);
    // <R x, dy> = <x, R^T dy> over the heads (the gaps hold x and dy themselves).
    double lhs = 0, rhs = 0, magnitude = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      lhs += double(rx[i]) * dy[i];
      rhs += double(x[i]) * rt_dy[i];
      magnitude += std::fabs(double(x[i])) * std::fabs(double(dy[i]));
    }
    // Each side: every product off by <= 4u (|a| + |b|) |c| summed: <= 8u sum |x||dy| x 2.
    EXPECT_NEAR(lhs, rhs, 16 * 0x1p-24 * magnitude) << "head_dim " << head_dim;
    const std::string what = "head_dim " + std::to_string(head_dim);
    const Rotation rot = rotation(head_dim, 10000.0, RopeScaling{});
    EXPECT_EQ(count_outside(rt_dy, direct(dy, l, positions, rot, true), rotation_bound(dy, l),
                            "backward " + what),
              0);
    Vec in_place = dy;
    shardlm::cpu::rope_backward(in_place.data(), l.ld, in_place.data(), l.ld, l.rows, l.heads,
                                head_dim, positions.data(), table);
    EXPECT_EQ(in_place, rt_dy) << what;
  }
}

TEST(Rope, RejectsBadInput) {
  EXPECT_THROW(RopeTable(23, 16, 10000.0, RopeScaling{}), shardlm::Error);  // odd head_dim
  EXPECT_THROW(RopeTable(0, 16, 10000.0, RopeScaling{}), shardlm::Error);
  EXPECT_THROW(RopeTable(8, 0, 10000.0, RopeScaling{}), shardlm::Error);
  EXPECT_THROW(RopeTable(8, 16, 0.0, RopeScaling{}), shardlm::Error);
  EXPECT_THROW(RopeTable(8, 16, 10000.0, RopeScaling{"yarn"}), shardlm::Error);
  EXPECT_THROW(RopeTable(8, 16, 10000.0, RopeScaling{"llama3", 8, 4, 4, 8192}), shardlm::Error);
  EXPECT_THROW(RopeTable(8, 16, 10000.0, RopeScaling{"llama3", 8, 1, 4, 0}), shardlm::Error);
  const RopeTable table(8, 16, 10000.0, RopeScaling{});
  Vec x(2 * 8, 1.0f);
  const int32_t inside[] = {0, 15}, outside[] = {0, 16}, negative[] = {-1, 0};
  EXPECT_NO_THROW(shardlm::cpu::rope_forward(x.data(), 8, x.data(), 8, 2, 1, 8, inside, table));
  EXPECT_THROW(shardlm::cpu::rope_forward(x.data(), 8, x.data(), 8, 2, 1, 8, outside, table),
               shardlm::Error);
  EXPECT_THROW(shardlm::cpu::rope_backward(x.data(), 8, x.data(), 8, 2, 1, 8, negative, table),
               shardlm::Error);
  EXPECT_THROW(shardlm::cpu::rope_forward(x.data(), 8, x.data(), 8, 1, 1, 6, inside, table),
               shardlm::Error);  // head_dim not the table's
  EXPECT_THROW(shardlm::cpu::rope_forward(x.data(), 4, x.data(), 8, 2, 1, 8, inside, table),
               shardlm::Error);  // stride shorter than a row
}

}  // namespace
