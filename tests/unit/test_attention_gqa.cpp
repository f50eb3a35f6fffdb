// Grouped-query attention, packed documents (key_begin) and general head_dim in the
// attention kernels (attention.hpp), against the naive double reference
// (naive_attention.hpp) element by element, within the bound it derives for the fp32
// kernels' roundings (see naive_attention::reference). Shapes are odd on purpose:
// T = 1, 9, 37, 67, 70, 75, 130 (one, two and three key blocks), head_dim 13, 24, 40,
// 64, 128, groups 8:2, 6:1, 6:2, 3:3 and 4:4, documents of length 1 and documents that
// cross a key block or start on one.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/core/error.hpp"
#include "kernel_test_helpers.hpp"
#include "naive_attention.hpp"
#include "relative_error.hpp"

namespace {

using namespace kernel_test;
using shardlm::ConstTypedPtr;
using shardlm::DType;
using shardlm::TypedPtr;
using Shape = naive_attention::AttentionShape;
using KeyBegin = std::vector<int32_t>;

shardlm::cpu::AttentionShape kernel_shape(const Shape& s) {
  return {s.B, s.T, s.H, s.kv_heads(), s.hd};
}


// Scores spread over several units: a peaked, not uniform, softmax.
Vec attention_input(const Shape& s, uint64_t seed) {
  return random_vec(s.qkv_size(), seed, 1.5 / std::pow(double(s.hd), 0.25));
}

// key_begin of rows packed with documents of the given lengths (each row's lengths
// add up to T).
KeyBegin packed(const Shape& s, const std::vector<std::vector<int>>& documents) {
  KeyBegin begin;
  for (int b = 0; b < s.B; ++b) {
    int start = 0;
    for (int length : documents[static_cast<size_t>(b)]) {
      for (int t = 0; t < length; ++t) begin.push_back(start);
      start += length;
    }
    EXPECT_EQ(start, s.T) << "documents of row " << b;
  }
  return begin;
}

struct AttentionRun {
  Vec out, lse, dqkv;
};

AttentionRun run_fp32(const Vec& qkv, const Vec& dout, const Shape& s, const int32_t* key_begin) {
  // dqkv starts as garbage: the backward must overwrite it.
  AttentionRun r{Vec(s.out_size()), Vec(s.lse_size()), Vec(s.qkv_size(), 12345.0f)};
  shardlm::cpu::attention_forward(r.out.data(), r.lse.data(), qkv.data(), kernel_shape(s),
                                  key_begin);
  shardlm::cpu::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(),
                                   r.lse.data(), kernel_shape(s), key_begin);
  return r;
}

struct Case {
  Shape s;
  std::vector<std::vector<int>> documents;  // empty: no key_begin
};

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.s.B) + " T=" + std::to_string(c.s.T) + " H=" +
         std::to_string(c.s.H) + " KV=" + std::to_string(c.s.kv_heads()) +
         " hd=" + std::to_string(c.s.hd) + (c.documents.empty() ? "" : " packed");
}

const Case kCases[] = {
    {{2, 37, 8, 24, 2}, {}},
    {{1, 37, 6, 40, 1}, {}},
    {{2, 37, 4, 64, 4}, {}},
    {{1, 70, 8, 64, 2}, {}},
    {{1, 130, 4, 128, 2}, {}},
    {{1, 37, 3, 13, 3}, {}},
    {{1, 1, 6, 40, 2}, {}},
    {{2, 37, 8, 24, 2}, {{1, 12, 1, 1, 22}, {37}}},
    {{1, 75, 6, 40, 2}, {{1, 20, 1, 45, 8}}},
    {{2, 70, 6, 64, 1}, {{64, 1, 5}, {3, 60, 7}}},
    {{1, 130, 4, 128, 2}, {{2, 100, 28}}},
};

TEST(AttentionGqa, ForwardAndBackwardWithinTheDerivedBoundOfNaiveDouble) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    const Shape& s = c.s;
    const KeyBegin begin = c.documents.empty() ? KeyBegin{} : packed(s, c.documents);
    const int32_t* key_begin = begin.empty() ? nullptr : begin.data();
    const Vec qkv = attention_input(s, ++seed);
    const Vec dout = random_vec(s.out_size(), ++seed);
    const AttentionRun got = run_fp32(qkv, dout, s, key_begin);
    const naive_attention::Reference want =
        naive_attention::reference(qkv, to_double(dout), s, key_begin);
    const std::string what = describe(c);
    EXPECT_EQ(count_outside(got.out, want.out, want.out_bound, "out " + what), 0);
    EXPECT_EQ(count_outside(got.lse, want.lse, want.lse_bound, "lse " + what), 0);
    EXPECT_EQ(count_outside(got.dqkv, want.dqkv, want.dqkv_bound, "dqkv " + what), 0);
    EXPECT_LT(largest_relative_bound(want.out, want.out_bound), 2e-5) << what;
    EXPECT_LT(largest_relative_bound(want.dqkv, want.dqkv_bound), 2e-4) << what;
  }
}

TEST(AttentionGqa, BackwardMatchesFiniteDifferencesOfTheNaiveForward) {
  const Shape s{1, 9, 4, 6, 2};
  const KeyBegin begin = packed(s, {{3, 4, 1, 1}});
  const Vec qkv = attention_input(s, 40);
  const DVec g = to_double(random_vec(s.out_size(), 41));
  const DVec fd = finite_difference(
      [&](const DVec& v) {
        const DVec out = naive_attention::forward(v, s, nullptr, begin.data());
        double dot = 0.0;
        for (size_t i = 0; i < out.size(); ++i) dot += g[i] * out[i];
        return dot;
      },
      to_double(qkv));
  const naive_attention::Reference want = naive_attention::reference(qkv, g, s, begin.data());
  EXPECT_LT(relative_to_max_error(want.dqkv, fd), 1e-8);  // the reference's own backward
  const Vec dout(g.begin(), g.end());
  const AttentionRun got = run_fp32(qkv, dout, s, begin.data());
  // The kernel's bound, widened by the differences' own error (~h^2, far below 1e-9).
  DVec bound = want.dqkv_bound;
  for (double& b : bound) b += 1e-9;
  EXPECT_EQ(count_outside(got.dqkv, fd, bound, "dqkv against finite differences"), 0);
}

// A packed row's documents give what each document gives run as its own sequence
// (within both runs' bounds: the blocking differs), and none of a document's results
// moves by a bit when the other documents' values change.
TEST(AttentionPackedDocuments, EqualTheDocumentsRunSeparatelyAndNeverCrossABoundary) {
  const Shape s{2, 75, 6, 40, 2};
  const std::vector<std::vector<int>> documents = {{1, 20, 1, 45, 8}, {64, 1, 10}};
  const KeyBegin begin = packed(s, documents);
  const Vec qkv = attention_input(s, 70);
  const Vec dout = random_vec(s.out_size(), 71);
  const AttentionRun packed_run = run_fp32(qkv, dout, s, begin.data());

  // Everything but the document [start, start + length) of row b replaced.
  Vec qkv_other = attention_input(s, 72), dout_other = random_vec(s.out_size(), 73);
  for (Vec* v : {&qkv_other, &dout_other})
    for (float& x : *v) x *= 3.0f;

  for (int b = 0; b < s.B; ++b) {
    int start = 0;
    for (int length : documents[static_cast<size_t>(b)]) {
      const std::string what = "row " + std::to_string(b) + " document at " + std::to_string(start);
      const size_t qkv_row = s.qkv_columns(), out_row = s.out_columns();
      const size_t first = static_cast<size_t>(b) * s.T + start;
      // Run alone.
      const Shape alone{1, length, s.H, s.hd, s.KV};
      const Vec qkv_alone(qkv.begin() + first * qkv_row, qkv.begin() + (first + length) * qkv_row);
      const Vec dout_alone(dout.begin() + first * out_row,
                           dout.begin() + (first + length) * out_row);
      const AttentionRun alone_run = run_fp32(qkv_alone, dout_alone, alone, nullptr);
      const naive_attention::Reference want =
          naive_attention::reference(qkv_alone, to_double(dout_alone), alone);
      auto rows_of = [&](const Vec& v, size_t width) {
        return Vec(v.begin() + first * width, v.begin() + (first + length) * width);
      };
      auto twice = [](DVec bound) {
        for (double& x : bound) x *= 2.0;
        return bound;
      };
      EXPECT_EQ(count_outside(rows_of(packed_run.out, out_row), to_double(alone_run.out),
                              twice(want.out_bound), "out " + what),
                0);
      EXPECT_EQ(count_outside(rows_of(packed_run.dqkv, qkv_row), to_double(alone_run.dqkv),
                              twice(want.dqkv_bound), "dqkv " + what),
                0);
      for (int h = 0; h < s.H; ++h)
        for (int t = 0; t < length; ++t)
          EXPECT_NEAR(packed_run.lse[naive_attention::lse_index(s, b, h, start + t)],
                      alone_run.lse[naive_attention::lse_index(alone, 0, h, t)],
                      2.0 * want.lse_bound[naive_attention::lse_index(alone, 0, h, t)])
              << what;

      // The same packed call with every other document changed.
      Vec qkv_mixed = qkv_other, dout_mixed = dout_other;
      std::copy(qkv_alone.begin(), qkv_alone.end(), qkv_mixed.begin() + first * qkv_row);
      std::copy(dout_alone.begin(), dout_alone.end(), dout_mixed.begin() + first * out_row);
      const AttentionRun mixed = run_fp32(qkv_mixed, dout_mixed, s, begin.data());
      EXPECT_EQ(rows_of(mixed.out, out_row), rows_of(packed_run.out, out_row)) << what;
      EXPECT_EQ(rows_of(mixed.dqkv, qkv_row), rows_of(packed_run.dqkv, qkv_row)) << what;
      for (int h = 0; h < s.H; ++h)
        for (int t = start; t < start + length; ++t)
          EXPECT_EQ(mixed.lse[naive_attention::lse_index(s, b, h, t)],
                    packed_run.lse[naive_attention::lse_index(s, b, h, t)])
              << what;
      start += length;
    }
  }
}

TEST(AttentionGqa, ResultsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  const Shape s{2, 70, 6, 24, 2};
  const KeyBegin begin = packed(s, {{5, 1, 64}, {70}});
  const Vec qkv = attention_input(s, 90), dout = random_vec(s.out_size(), 91);
  std::vector<AttentionRun> runs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    runs.push_back(run_fp32(qkv, dout, s, begin.data()));
  }
  omp_set_num_threads(saved);
  for (size_t k = 1; k < runs.size(); ++k) {
    EXPECT_EQ(runs[k].out, runs[0].out);
    EXPECT_EQ(runs[k].lse, runs[0].lse);
    EXPECT_EQ(runs[k].dqkv, runs[0].dqkv);
  }
}

// ---------------------------------------------------------------- compute types

// GQA and packed documents in bf16 and fp16 run the widening path on every CPU (kAuto
// included): the fp32 kernels on the stored values, out rounded once when stored.
class AttentionGqaComputeType : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionGqaComputeType, IsTheFp32KernelOnTheStoredValuesRoundedOnce) {
  const DType type = GetParam();
  for (const Case& c : {Case{{2, 37, 8, 24, 2}, {}}, Case{{1, 75, 6, 40, 1}, {{1, 20, 1, 45, 8}}},
                        Case{{1, 70, 8, 64, 2}, {{64, 6}}}}) {
    const Shape& s = c.s;
    const KeyBegin begin = c.documents.empty() ? KeyBegin{} : packed(s, c.documents);
    const int32_t* key_begin = begin.empty() ? nullptr : begin.data();
    const std::string what = std::string(shardlm::dtype_name(type)) + " " + describe(c);
    const Half qkv = to_half(type, attention_input(s, 200 + s.T));
    const Vec dout = random_vec(s.out_size(), 300 + s.T);
    const ConstTypedPtr qkv_typed(qkv.data(), type);

    Half out(s.out_size());
    Vec lse(s.lse_size()), dqkv(s.qkv_size(), 1234.0f);
    shardlm::cpu::attention_forward(TypedPtr(out.data(), type), lse.data(), qkv_typed,
                                    kernel_shape(s), key_begin);
    shardlm::cpu::attention_backward(dqkv.data(), dout.data(), qkv_typed,
                                     ConstTypedPtr(out.data(), type), lse.data(), kernel_shape(s),
                                     key_begin);

    // The fp32 kernels on the widened values: the backward reads the stored out.
    const Vec qkv_wide = widen(type, qkv), out_wide = widen(type, out);
    Vec out32(s.out_size()), lse32(s.lse_size()), dqkv32(s.qkv_size());
    shardlm::cpu::attention_forward(out32.data(), lse32.data(), qkv_wide.data(), kernel_shape(s),
                                    key_begin);
    shardlm::cpu::attention_backward(dqkv32.data(), dout.data(), qkv_wide.data(), out_wide.data(),
                                     lse.data(), kernel_shape(s), key_begin);
    EXPECT_EQ(out, to_half(type, out32)) << what;
    EXPECT_EQ(lse, lse32) << what;
    EXPECT_EQ(dqkv, dqkv32) << what;

    // Against naive double on the stored values: out's one rounding on top of the bound.
    const naive_attention::Reference want =
        naive_attention::reference(qkv_wide, to_double(dout), s, key_begin);
    DVec out_bound = want.out_bound;
    for (size_t i = 0; i < out_bound.size(); ++i)
      out_bound[i] += unit_roundoff(type) * std::fabs(want.out[i]);
    EXPECT_EQ(count_outside(out_wide, want.out, out_bound, "out " + what), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, AttentionGqaComputeType,
                         ::testing::Values(DType::bf16, DType::fp16), [](const auto& info) {
                           return std::string(shardlm::dtype_name(info.param));
                         });

TEST(AttentionGqaComputeType, Bf16AutoTakesTheWideningPathForGqaAndPackedDocuments) {
  const Shape gqa{1, 37, 6, 24, 2}, mha{1, 37, 2, 24, 2};
  EXPECT_FALSE(shardlm::cpu::attention_uses_bf16_dot_products(kernel_shape(gqa)));
  EXPECT_FALSE(shardlm::cpu::attention_uses_bf16_dot_products(kernel_shape(mha), true));
  const KeyBegin begin = packed(mha, {{10, 27}});
  for (const auto& [s, key_begin] : {std::pair{gqa, static_cast<const int32_t*>(nullptr)},
                                     std::pair{mha, begin.data()}}) {
    const Half qkv = to_half(DType::bf16, attention_input(s, 900));
    const ConstTypedPtr in(qkv.data(), DType::bf16);
    Half out_auto(s.out_size()), out_widen(s.out_size());
    Vec lse(s.lse_size());
    shardlm::cpu::attention_forward(TypedPtr(out_auto.data(), DType::bf16), lse.data(), in,
                                    kernel_shape(s), key_begin);
    shardlm::cpu::attention_forward_on(shardlm::cpu::Bf16AttentionPath::kWidenToFp32,
                                       TypedPtr(out_widen.data(), DType::bf16), lse.data(), in,
                                       kernel_shape(s), key_begin);
    EXPECT_EQ(out_auto, out_widen);
    EXPECT_THROW(shardlm::cpu::attention_forward_on(
                     shardlm::cpu::Bf16AttentionPath::kBf16DotProducts,
                     TypedPtr(out_auto.data(), DType::bf16), lse.data(), in, kernel_shape(s),
                     key_begin),
                 shardlm::Error);
  }
}

// ---------------------------------------------------------------- bad input

TEST(AttentionGqa, RejectsBadShapesAndKeyRanges) {
  Vec buf(4096);
  auto forward = [&](shardlm::cpu::AttentionShape s, const int32_t* key_begin = nullptr) {
    shardlm::cpu::attention_forward(buf.data(), buf.data(), buf.data(), s, key_begin);
  };
  EXPECT_THROW(forward({1, 2, 6, 4, 8}), shardlm::Error);    // 6 query heads, 4 kv heads
  EXPECT_THROW(forward({1, 2, 2, 0, 8}), shardlm::Error);    // no kv heads
  EXPECT_THROW(forward({1, 2, 2, 2, 0}), shardlm::Error);    // head_dim 0
  EXPECT_THROW(forward({1, 2, 1, 1, 129}), shardlm::Error);  // head_dim above 128
  EXPECT_THROW(forward({1, 0, 2, 2, 8}), shardlm::Error);    // no positions
  const int32_t after_query[] = {0, 2}, negative[] = {0, -1}, fine[] = {0, 1};
  EXPECT_THROW(forward({1, 2, 2, 1, 8}, after_query), shardlm::Error);
  EXPECT_THROW(forward({1, 2, 2, 1, 8}, negative), shardlm::Error);
  EXPECT_NO_THROW(forward({1, 2, 2, 1, 8}, fine));
  EXPECT_THROW(shardlm::cpu::attention_backward(buf.data(), buf.data(), buf.data(), buf.data(),
                                                buf.data(), {1, 2, 2, 1, 8}, after_query),
               shardlm::Error);
}

}  // namespace
