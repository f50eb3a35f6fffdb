// Kernels that read and write compute-type (bf16, fp16) tensors directly, against
// independent references on the same rounded inputs:
//  - the widening paths bitwise against the fp32 kernel run on the widened stored
//    values (they promise fp32 arithmetic on what is stored, rounded once when
//    stored), and against a naive double implementation written here, within the
//    tolerance the output's one rounding allows (the unit roundoff u: 2^-8 relative
//    for bf16, 2^-11 for fp16) plus fp32 noise;
//  - bf16 attention on avx512_bf16 dot products (which also rounds P, dS and dout to
//    bf16) against the naive double forward and backward, element by element, within
//    a bound derived from those roundings (see attention_bound).
// Shapes are odd on purpose: T = 1, 7, 13, 33, 65, 67, 130; head_dim 8, 24, 64.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "kernel_test_helpers.hpp"
#include "naive_attention.hpp"
#include "relative_error.hpp"

namespace {

using namespace kernel_test;
using shardlm::DType;
using shardlm::ConstTypedPtr;
using shardlm::TypedPtr;

// ---------------------------------------------------------------- conversion

// convert() fp32 -> bf16 (vcvtne2ps2bf16 where the CPU has avx512_bf16) is float_to_bf16
// bit for bit, including subnormals (which the instruction alone would flush), NaN
// payloads, infinities, signed zeros, ties and values that round up to infinity,
// wherever they fall in a block of 32, on the threaded and the single-thread path.
TEST(ConvertToBf16, EqualsTheScalarRoundingBitForBit) {
  const std::vector<uint32_t> specials = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu,
      0x00400000u, 0x00008000u, 0x00018000u, 0x00800000u, 0x7f800000u, 0xff800000u,
      0x7f800001u, 0xffc00001u, 0x7fc00000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,
      0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu, 0x00ffffffu, 0x40490fdbu};
  for (const int64_t n : {int64_t{31}, int64_t{32}, int64_t{100}, int64_t{70001}}) {
    Vec src = random_vec(static_cast<size_t>(n), 1000 + n, 10.0);
    // Specials at scattered positions, so some 32-blocks hold one and others do not.
    for (size_t k = 0; k < specials.size(); ++k) {
      const size_t at = (k * 977 + 5) % src.size();
      src[at] = std::bit_cast<float>(specials[k]);
    }
    Half got(src.size());
    shardlm::cpu::convert(TypedPtr(got.data(), DType::bf16), src.data(), n);
    for (size_t i = 0; i < src.size(); ++i)
      ASSERT_EQ(got[i], shardlm::float_to_bf16(src[i]))
          << "n=" << n << " i=" << i << " bits " << std::hex << std::bit_cast<uint32_t>(src[i]);
  }
}

// ---------------------------------------------------------------- bias

TEST(AddBiasComputeType, StoresTheFp32SumRoundedOnce) {
  for (const DType type : {DType::bf16, DType::fp16}) {
    for (const auto& [N, M] : {std::pair{7, 13}, std::pair{33, 65}, std::pair{1, 1152}}) {
      const Vec in = random_vec(static_cast<size_t>(N) * M, 400 + M);
      const Vec bias = random_vec(static_cast<size_t>(M), 500 + M);
      Half out(in.size());
      shardlm::cpu::add_bias(TypedPtr(out.data(), type), in.data(), bias.data(), N, M);
      Vec want(in.size());
      for (int n = 0; n < N; ++n)
        for (int m = 0; m < M; ++m)
          want[static_cast<size_t>(n) * M + m] = shardlm::round_to(
              type, in[static_cast<size_t>(n) * M + m] + bias[static_cast<size_t>(m)]);
      EXPECT_EQ(widen(type, out), want) << shardlm::dtype_name(type) << " N=" << N << " M=" << M;
    }
  }
  // fp32 in place equals the in-place overload.
  Vec a = random_vec(7 * 13, 600), b = a;
  const Vec bias = random_vec(13, 601);
  shardlm::cpu::add_bias(TypedPtr(a.data()), a.data(), bias.data(), 7, 13);
  shardlm::cpu::add_bias(b.data(), bias.data(), 7, 13);
  EXPECT_EQ(a, b);
}

// ---------------------------------------------------------------- attention

using naive_attention::AttentionShape;

const AttentionShape kShapes[] = {{2, 1, 2, 8},  {2, 7, 2, 8},   {1, 13, 3, 8},  {2, 33, 2, 64},
                                  {1, 65, 2, 24}, {1, 130, 1, 64}, {1, 67, 2, 24}};

// Naive causal attention in double: out [B, T, C] and the per-row log-sum-exp.
DVec attention_ref(const Vec& qkv, const AttentionShape& s, DVec* lse) {
  return naive_attention::forward(qkv, s, lse);
}

shardlm::cpu::AttentionShape kernel_shape(const AttentionShape& s) {
  return {s.B, s.T, s.H, s.kv_heads(), s.hd};
}

// The widening path (fp16 always; bf16 where the CPU has no avx512_bf16).
constexpr auto kWiden = shardlm::cpu::Bf16AttentionPath::kWidenToFp32;

class AttentionComputeType : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionComputeType, ForwardIsTheFp32KernelOnTheStoredValuesRoundedOnce) {
  const DType type = GetParam();
  for (const AttentionShape s : kShapes) {
    const int C = s.H * s.hd;
    const size_t n_out = static_cast<size_t>(s.B) * s.T * C;
    const size_t n_lse = static_cast<size_t>(s.B) * s.H * s.T;
    const Half qkv = to_half(type, random_vec(n_out * 3, 100 + s.T, 1.5 / std::pow(s.hd, 0.25)));
    const Vec qkv_wide = widen(type, qkv);

    Half out(n_out);
    Vec lse(n_lse);
    shardlm::cpu::attention_forward_on(kWiden, TypedPtr(out.data(), type), lse.data(),
                                       ConstTypedPtr(qkv.data(), type), kernel_shape(s));
    Vec out32(n_out), lse32(n_lse);
    shardlm::cpu::attention_forward(out32.data(), lse32.data(), qkv_wide.data(), kernel_shape(s));
    EXPECT_EQ(out, to_half(type, out32)) << "T=" << s.T << " hd=" << s.hd;
    EXPECT_EQ(lse, lse32) << "T=" << s.T << " hd=" << s.hd;

    DVec want_lse(n_lse);
    const DVec want = attention_ref(qkv_wide, s, &want_lse);
    EXPECT_LT(relative_to_max_error(widen(type, out), want), unit_roundoff(type) + 2e-6)
        << "T=" << s.T << " hd=" << s.hd;
    EXPECT_LT(relative_to_max_error(lse, want_lse), 2e-6) << "T=" << s.T << " hd=" << s.hd;
  }
}

TEST_P(AttentionComputeType, BackwardIsTheFp32KernelOnTheStoredValues) {
  const DType type = GetParam();
  for (const AttentionShape s : kShapes) {
    const int C = s.H * s.hd;
    const size_t n_out = static_cast<size_t>(s.B) * s.T * C;
    const size_t n_lse = static_cast<size_t>(s.B) * s.H * s.T;
    const Half qkv = to_half(type, random_vec(n_out * 3, 200 + s.T, 1.5 / std::pow(s.hd, 0.25)));
    const Vec dout = random_vec(n_out, 300 + s.T);
    Half out(n_out);
    Vec lse(n_lse);
    shardlm::cpu::attention_forward_on(kWiden, TypedPtr(out.data(), type), lse.data(),
                                       ConstTypedPtr(qkv.data(), type), kernel_shape(s));
    Vec dqkv(qkv.size(), 1234.0f);  // must be overwritten
    shardlm::cpu::attention_backward_on(kWiden, dqkv.data(), dout.data(),
                                        ConstTypedPtr(qkv.data(), type),
                                        ConstTypedPtr(out.data(), type), lse.data(),
                                        kernel_shape(s));
    const Vec qkv_wide = widen(type, qkv), out_wide = widen(type, out);
    Vec dqkv32(qkv.size(), -1.0f);
    shardlm::cpu::attention_backward(dqkv32.data(), dout.data(), qkv_wide.data(), out_wide.data(),
                                     lse.data(), kernel_shape(s));
    EXPECT_EQ(dqkv, dqkv32) << "T=" << s.T << " hd=" << s.hd;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, AttentionComputeType, ::testing::Values(DType::bf16, DType::fp16),
                         [](const auto& info) { return std::string(shardlm::dtype_name(info.param)); });

// Naive double attention forward and backward with, per output element, the sum of
// the magnitudes that the bf16 dot-product kernel's roundings scale. With u the unit
// roundoff of bf16 and all other error at fp32 level (~1e-6 relative):
//  - out_i = sum_j p_ij v_j with p_ij rounded (relative error <= u), then out rounded:
//    |error| <= u sum_j p_ij |v_j| + u |out_i| <= 2u sum_j p_ij |v_j|.
//  - dv_j = sum_i p_ij dout_i, both factors rounded: |error| <= ~2u sum_i p_ij |dout_i|.
//  - ds_ij = p_ij (dp_ij - D_i) scale with dp_ij = dout_i . v_j and D_i = dout_i . out_i
//    on rounded dout (|error| <= u sum_d |dout_id| (|v_jd| + |out_id|)), then ds
//    rounded (u |ds_ij|): |error(ds_ij)| <= u (|ds_ij| + p_ij scale sum_d |dout_id|
//    (|v_jd| + |out_id|)) =: u e_ij;
//    dq_i = sum_j ds_ij k_j and dk_j = sum_i ds_ij q_i: |error| <= u sum e_ij |k_j| (|q_i|).
struct AttentionReference {
  DVec out, out_bound, dqkv, dqkv_bound;
};

AttentionReference attention_reference(const Vec& qkv, const Vec& dout, const AttentionShape& s) {
  const double scale = 1.0 / std::sqrt(double(s.hd));
  AttentionReference r;
  r.out.assign(dout.size(), 0.0);
  r.out_bound.assign(dout.size(), 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  r.dqkv_bound.assign(qkv.size(), 0.0);
  auto idx = [&](int b, int t, int group, int h, int d) {
    return naive_attention::qkv_index(s, b, t, group, h, d);
  };
  auto out_idx = [&](int b, int t, int h, int d) {
    return naive_attention::out_index(s, b, t, h, d);
  };
  DVec p;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.T; ++i) {
        naive_attention::softmax_row(qkv, s, b, h, i, p);
        double D = 0.0, D_mag = 0.0;
        for (int d = 0; d < s.hd; ++d) {
          double acc = 0.0, mag = 0.0;
          for (int j = 0; j <= i; ++j) {
            acc += p[j] * qkv[idx(b, j, 2, h, d)];
            mag += p[j] * std::fabs(double(qkv[idx(b, j, 2, h, d)]));
          }
          r.out[out_idx(b, i, h, d)] = acc;
          r.out_bound[out_idx(b, i, h, d)] = mag;
          D += double(dout[out_idx(b, i, h, d)]) * acc;
          D_mag += std::fabs(double(dout[out_idx(b, i, h, d)]) * acc);
        }
        for (int j = 0; j <= i; ++j) {
          double dp = 0.0, dp_mag = 0.0;
          for (int d = 0; d < s.hd; ++d) {
            const double g = dout[out_idx(b, i, h, d)], v = qkv[idx(b, j, 2, h, d)];
            dp += g * v;
            dp_mag += std::fabs(g * v);
            r.dqkv[idx(b, j, 2, h, d)] += p[j] * g;
            r.dqkv_bound[idx(b, j, 2, h, d)] += p[j] * std::fabs(g);
          }
          const double ds = p[j] * (dp - D) * scale;
          const double e = std::fabs(ds) + p[j] * scale * (dp_mag + D_mag);
          for (int d = 0; d < s.hd; ++d) {
            const double q = qkv[idx(b, i, 0, h, d)], k = qkv[idx(b, j, 1, h, d)];
            r.dqkv[idx(b, i, 0, h, d)] += ds * k;
            r.dqkv_bound[idx(b, i, 0, h, d)] += e * std::fabs(k);
            r.dqkv[idx(b, j, 1, h, d)] += ds * q;
            r.dqkv_bound[idx(b, j, 1, h, d)] += e * std::fabs(q);
          }
        }
      }
  return r;
}

// Number of elements with |got - want| > factor * u * bound + floor (floor: fp32 noise
// relative to the largest reference value); prints the first.
template <typename Got>
int count_outside(const Got& got, const DVec& want, const DVec& bound, double factor) {
  double max_want = 0.0;
  for (double w : want) max_want = std::max(max_want, std::fabs(w));
  const double u = unit_roundoff(DType::bf16), floor = 1e-5 * max_want;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (err > factor * u * bound[i] + floor && bad++ == 0)
      ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want[i]
                    << " bound " << factor * u * bound[i] + floor;
  }
  return bad;
}

TEST(AttentionBf16DotProducts, MatchNaiveDoubleWithinTheRoundingBound) {
  if (!shardlm::cpu::attention_uses_bf16_dot_products({1, 1, 1, 1, 8}))
    GTEST_SKIP() << "this CPU has no avx512_bf16";
  constexpr auto kDot = shardlm::cpu::Bf16AttentionPath::kBf16DotProducts;
  for (const AttentionShape s : kShapes) {
    const int C = s.H * s.hd;
    const size_t n_out = static_cast<size_t>(s.B) * s.T * C;
    const size_t n_lse = static_cast<size_t>(s.B) * s.H * s.T;
    const Half qkv =
        to_half(DType::bf16, random_vec(n_out * 3, 700 + s.T, 1.5 / std::pow(s.hd, 0.25)));
    const Vec dout = random_vec(n_out, 800 + s.T);
    Half out(n_out);
    Vec lse(n_lse);
    shardlm::cpu::attention_forward_on(kDot, TypedPtr(out.data(), DType::bf16), lse.data(),
                                       ConstTypedPtr(qkv.data(), DType::bf16), kernel_shape(s));
    Vec dqkv(qkv.size(), 1234.0f);  // must be overwritten
    shardlm::cpu::attention_backward_on(kDot, dqkv.data(), dout.data(),
                                        ConstTypedPtr(qkv.data(), DType::bf16),
                                        ConstTypedPtr(out.data(), DType::bf16), lse.data(),
                                        kernel_shape(s));
    const AttentionReference want = attention_reference(widen(DType::bf16, qkv), dout, s);
    EXPECT_EQ(count_outside(widen(DType::bf16, out), want.out, want.out_bound, 2.0), 0)
        << "forward T=" << s.T << " hd=" << s.hd;
    EXPECT_EQ(count_outside(dqkv, want.dqkv, want.dqkv_bound, 2.0), 0)
        << "backward T=" << s.T << " hd=" << s.hd;
    DVec want_lse(n_lse);
    attention_ref(widen(DType::bf16, qkv), s, &want_lse);
    EXPECT_LT(relative_to_max_error(lse, want_lse), 2e-6) << "T=" << s.T << " hd=" << s.hd;
  }
}

TEST(AttentionBf16DotProducts, AutoTakesThemWhereAvailable) {
  const AttentionShape s{1, 33, 2, 24};
  const int C = s.H * s.hd;
  const size_t n_out = static_cast<size_t>(s.T) * C;
  const Half qkv = to_half(DType::bf16, random_vec(n_out * 3, 900, 0.7));
  Half out_auto(n_out), out_dot(n_out), out_widen(n_out);
  Vec lse(static_cast<size_t>(s.H) * s.T);
  const ConstTypedPtr in(qkv.data(), DType::bf16);
  shardlm::cpu::attention_forward(TypedPtr(out_auto.data(), DType::bf16), lse.data(), in,
                                  kernel_shape(s));
  shardlm::cpu::attention_forward_on(kWiden, TypedPtr(out_widen.data(), DType::bf16), lse.data(),
                                     in, kernel_shape(s));
  if (shardlm::cpu::attention_uses_bf16_dot_products(kernel_shape(s))) {
    shardlm::cpu::attention_forward_on(shardlm::cpu::Bf16AttentionPath::kBf16DotProducts,
                                       TypedPtr(out_dot.data(), DType::bf16), lse.data(), in,
                                       kernel_shape(s));
    EXPECT_EQ(out_auto, out_dot);
  } else {
    EXPECT_EQ(out_auto, out_widen);
  }
}

TEST(AttentionComputeType, RejectsOutputAndQkvOfDifferentTypes) {
  Half qkv(3 * 8), out(8);
  Vec lse(1);
  EXPECT_THROW(shardlm::cpu::attention_forward(TypedPtr(out.data(), DType::fp16), lse.data(),
                                               ConstTypedPtr(qkv.data(), DType::bf16),
                                               {1, 1, 1, 1, 8}),
               shardlm::Error);
}

}  // namespace
