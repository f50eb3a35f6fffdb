// Mixed precision against independent references:
//  - bf16/fp16 rounding against a reference written here from the definition
//    (nearest representable value, ties to even; overflow to inf; subnormals; NaN);
//  - the mixed GEMM on every path (oneDNN bf16 matmul, widening fallback, fp16)
//    against a naive double GEMM of the same rounded inputs (tight: only fp32
//    accumulation error) and of the unrounded inputs (the bf16 bound below);
//  - the kernels that store in a compute type: exactly the fp32 result rounded once;
//  - the fused LM head + loss in bf16 against a naive double head;
//  - the whole GPT-2 model in bf16/fp16 against the PyTorch fixture.
//
// Tolerances follow from the formats: bf16 keeps 8 significant bits, so rounding to
// nearest changes a value by at most its unit roundoff u = 2^-8 relative; a product
// of two rounded inputs by at most ~2u, so a dot product by at most 2u * sum |a_k b_k|.
// fp16 keeps 11 bits (u = 2^-11) within its range.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/gelu.hpp"
#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/cpu/lm_head_loss.hpp"
#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"
#include "shardlm/optim/adamw.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

namespace {

using shardlm::DType;
namespace cpu = shardlm::cpu;
using namespace shardlm;  // dtypes and scalar conversions (core/dtype.hpp)

constexpr double kBf16Unit = 1.0 / 256;   // 2^-8
constexpr double kFp16Unit = 1.0 / 2048;  // 2^-11

std::vector<float> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  shardlm::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

// ---------------------------------------------------------------- rounding

// Round to a binary format with `mantissa_bits` stored bits, exponent range
// [min_exp, max_exp] (of normal numbers), from the definition: scale to an integer
// significand, round half to even, rescale; below the normal range the quantum stays
// 2^(min_exp - mantissa_bits). Returns +-inf beyond the largest finite value.
double round_reference(double x, int mantissa_bits, int min_exp, int max_exp) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  int exp = std::ilogb(x);
  if (exp < min_exp) exp = min_exp;
  const double quantum = std::ldexp(1.0, exp - mantissa_bits);
  const double q = x / quantum;
  double r = std::floor(q);
  const double frac = q - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  const double rounded = r * quantum;
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, -mantissa_bits), max_exp);
  if (std::fabs(rounded) > largest) return std::copysign(INFINITY, x);
  return rounded;
}
double bf16_reference(float x) { return round_reference(x, 7, -126, 127); }
double fp16_reference(float x) { return round_reference(x, 10, -14, 15); }

std::vector<float> rounding_cases() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f,
                          3.0e38f, std::numeric_limits<float>::max(), 1e-8f, 5.96e-8f, 2.98e-8f,
                          6.1e-5f, 1e-40f, INFINITY, -INFINITY};
  // Exact ties and their neighbours for both formats.
  for (float base : {1.0f, 3.0f, 1000.0f, 1e-3f}) {
    for (int bits : {8, 11}) {
      const float tie = base * (1.0f + std::ldexp(1.0f, -bits));
      v.push_back(tie);
      v.push_back(std::nextafter(tie, 0.0f));
      v.push_back(std::nextafter(tie, INFINITY));
      v.push_back(base * (1.0f + 3.0f * std::ldexp(1.0f, -bits)));  // tie, odd below
    }
  }
  shardlm::Rng rng(1);
  for (int i = 0; i < 20000; ++i)
    v.push_back(static_cast<float>(rng.normal() * std::ldexp(1.0, static_cast<int>(rng.below(60)) - 30)));
  return v;
}

TEST(Rounding, Bf16AndFp16MatchTheDefinition) {
  for (float x : rounding_cases()) {
    const double want_bf16 = bf16_reference(x);
    const float got_bf16 = bf16_to_float(float_to_bf16(x));
    ASSERT_EQ(static_cast<double>(got_bf16), want_bf16) << "bf16 of " << x;
    ASSERT_EQ(std::signbit(got_bf16), std::signbit(x)) << "bf16 sign of " << x;
    const double want_fp16 = fp16_reference(x);
    const float got_fp16 = fp16_to_float(float_to_fp16(x));
    ASSERT_EQ(static_cast<double>(got_fp16), want_fp16) << "fp16 of " << x;
    EXPECT_EQ(round_to(DType::bf16, x), got_bf16);
    EXPECT_EQ(round_to(DType::fp16, x), got_fp16);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(nan))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(-nan))));
  // A NaN whose payload sits in the low bits only must not become inf.
  const float low_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(nan))));
}

TEST(Rounding, ArrayConversionsMatchTheScalarOnes) {
  const std::vector<float> src = random_vec(100003, 2, 100.0);  // parallel path + odd tail
  for (DType t : {DType::bf16, DType::fp16}) {
    std::vector<uint16_t> half(src.size());
    cpu::convert(TypedPtr(half.data(), t), src.data(), static_cast<int64_t>(src.size()));
    std::vector<float> back(src.size());
    cpu::convert(back.data(), ConstTypedPtr(half.data(), t), static_cast<int64_t>(src.size()));
    std::vector<float> rounded(src.size());
    cpu::round_to(t, rounded.data(), src.data(), static_cast<int64_t>(src.size()));
    for (size_t i = 0; i < src.size(); ++i) {
      ASSERT_EQ(back[i], round_to(t, src[i])) << i;
      ASSERT_EQ(rounded[i], back[i]) << i;
    }
    // Strided rows: only the first `cols` of each row are converted.
    const int rows = 7, cols = 1000, ld = 1024;
    std::vector<uint16_t> strided(static_cast<size_t>(rows) * ld, 0xffff);
    cpu::convert_rows(TypedPtr(strided.data(), t), ld, src.data(), ld, rows, cols);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < ld; ++c) {
        const uint16_t v = strided[static_cast<size_t>(r) * ld + c];
        if (c >= cols) {
          ASSERT_EQ(v, 0xffff);
        } else {
          ASSERT_EQ(v, half[static_cast<size_t>(r) * ld + c]);
        }
      }
  }
}

// ---------------------------------------------------------------- GEMM

struct GemmCase {
  bool ta, tb;
  int M, N, K;
  int pad;  // extra elements per stored row (strides larger than the rows)
  float alpha, beta;
};

struct Operand {
  std::vector<float> values;     // as given (fp32)
  std::vector<float> rounded;    // rounded to the type
  std::vector<uint16_t> stored;  // the type's bits (bf16/fp16), same layout
  int ld = 0;
};

Operand make_operand(int rows, int cols, int pad, DType t, uint64_t seed) {
  Operand o;
  o.ld = cols + pad;
  o.values = random_vec(static_cast<size_t>(rows) * o.ld, seed);
  o.rounded.resize(o.values.size());
  o.stored.resize(o.values.size());
  for (size_t i = 0; i < o.values.size(); ++i) {
    o.rounded[i] = round_to(t, o.values[i]);
    o.stored[i] = t == DType::bf16 ? float_to_bf16(o.values[i]) : float_to_fp16(o.values[i]);
  }
  return o;
}

// Naive double GEMM; also returns sum_k |a_mk b_kn| per output (the error scale).
void naive_gemm(const GemmCase& c, const std::vector<float>& a, int lda, const std::vector<float>& b,
                int ldb, const std::vector<float>& c0, int ldc, std::vector<double>& out,
                std::vector<double>& magnitude) {
  out.assign(static_cast<size_t>(c.M) * ldc, 0.0);
  magnitude.assign(out.size(), 0.0);
  for (int m = 0; m < c.M; ++m)
    for (int n = 0; n < c.N; ++n) {
      double sum = 0.0, mag = 0.0;
      for (int k = 0; k < c.K; ++k) {
        const double av = c.ta ? a[static_cast<size_t>(k) * lda + m] : a[static_cast<size_t>(m) * lda + k];
        const double bv = c.tb ? b[static_cast<size_t>(n) * ldb + k] : b[static_cast<size_t>(k) * ldb + n];
        sum += av * bv;
        mag += std::fabs(av * bv);
      }
      const size_t i = static_cast<size_t>(m) * ldc + n;
      out[i] = c.alpha * sum + (c.beta != 0.0f ? c.beta * static_cast<double>(c0[i]) : 0.0);
      magnitude[i] = std::fabs(c.alpha) * mag + std::fabs(c.beta * c0[i]);
    }
}

void check_gemm(const GemmCase& c, DType t, cpu::Bf16GemmPath path, uint64_t seed) {
  const Operand a = make_operand(c.ta ? c.K : c.M, c.ta ? c.M : c.K, c.pad, t, seed);
  const Operand b = make_operand(c.tb ? c.N : c.K, c.tb ? c.K : c.N, c.pad, t, seed + 1);
  const int ldc = c.N + c.pad;
  std::vector<float> c0 = random_vec(static_cast<size_t>(c.M) * ldc, seed + 2);
  std::vector<float> got = c0;
  if (c.beta == 0.0f)  // beta = 0 must not read C
    for (auto& x : got) x = std::numeric_limits<float>::quiet_NaN();
  cpu::gemm_on(path, c.ta, c.tb, c.M, c.N, c.K, c.alpha, ConstTypedPtr(a.stored.data(), t), a.ld,
               ConstTypedPtr(b.stored.data(), t), b.ld, c.beta, got.data(), ldc);
  std::vector<double> want_rounded, want_exact, magnitude;
  naive_gemm(c, a.rounded, a.ld, b.rounded, b.ld, c0, ldc, want_rounded, magnitude);
  naive_gemm(c, a.values, a.ld, b.values, b.ld, c0, ldc, want_exact, magnitude);
  const double unit = t == DType::bf16 ? kBf16Unit : kFp16Unit;
  const std::string what = std::string(shardlm::dtype_name(t)) + " ta=" + std::to_string(c.ta) +
                           " tb=" + std::to_string(c.tb) + " M=" + std::to_string(c.M) +
                           " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                           " path=" + std::to_string(static_cast<int>(path));
  for (int m = 0; m < c.M; ++m)
    for (int n = 0; n < ldc; ++n) {
      const size_t i = static_cast<size_t>(m) * ldc + n;
      if (n >= c.N) {  // outside the result: untouched
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : c0[i])) << what;
        continue;
      }
      // The product of the rounded inputs, accumulated in fp32 (K + 2 roundings).
      ASSERT_NEAR(got[i], want_rounded[i], (c.K + 2) * 6e-8 * magnitude[i] + 1e-30) << what << " at " << m << "," << n;
      // The unrounded product, up to the input rounding.
      ASSERT_NEAR(got[i], want_exact[i], 2.0 * unit * magnitude[i] * 1.01 + 1e-30) << what;
    }
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      cases.push_back({ta, tb, 37, 53, 29, 0, 1.0f, 0.0f});
      cases.push_back({ta, tb, 64, 96, 128, 3, 1.0f, 1.0f});
      cases.push_back({ta, tb, 5, 300, 17, 5, 0.7f, 0.5f});
    }
  // Dense operands of a linear layer's three products, which oneDNN runs on its
  // brgemm kernel unless told otherwise (kOneDnnMatmulDense).
  cases.push_back({false, false, 128, 192, 64, 0, 1.0f, 0.0f});
  cases.push_back({false, true, 128, 64, 192, 0, 1.0f, 0.0f});
  cases.push_back({true, false, 64, 192, 128, 0, 1.0f, 1.0f});
  cases.push_back({false, true, 160, 1000, 64, 24, 1.0f, 0.0f});  // the head's logits shape
  cases.push_back({true, false, 1000, 64, 160, 24, 1.0f, 1.0f});  // and its weight gradient
  return cases;
}

TEST(MixedGemm, Bf16OnOneDnnMatchesNaiveDouble) {
  if (!cpu::onednn_has_bf16_matmul()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  std::printf("oneDNN bf16 matmul: %s\n", cpu::onednn_bf16_matmul_impl());
  uint64_t seed = 10;
  for (auto path : {cpu::Bf16GemmPath::kOneDnnMatmul, cpu::Bf16GemmPath::kOneDnnMatmulDense})
    for (const GemmCase& c : gemm_cases()) check_gemm(c, DType::bf16, path, seed += 3);
}

TEST(MixedGemm, Bf16WideningFallbackMatchesNaiveDouble) {
  uint64_t seed = 50;
  for (const GemmCase& c : gemm_cases()) check_gemm(c, DType::bf16, cpu::Bf16GemmPath::kWidenToFp32, seed += 3);
}

TEST(MixedGemm, Fp16MatchesNaiveDouble) {
  uint64_t seed = 90;
  for (const GemmCase& c : gemm_cases()) check_gemm(c, DType::fp16, cpu::Bf16GemmPath::kAuto, seed += 3);
}

TEST(MixedGemm, Fp32OperandsRunSgemmAndMixedOperandsAreWidened) {
  // fp32 x fp32 is sgemm bit for bit; bf16 x fp32 widens only the bf16 side.
  const int M = 19, N = 23, K = 31;
  const auto a = random_vec(M * K, 200), b = random_vec(K * N, 201);
  std::vector<float> c1(M * N), c2(M * N);
  cpu::gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c1.data(), N);
  cpu::sgemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c2.data(), N);
  EXPECT_EQ(c1, c2);
  std::vector<uint16_t> a16(a.size());
  std::vector<float> a_rounded(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a16[i] = float_to_bf16(a[i]);
    a_rounded[i] = bf16_to_float(a16[i]);
  }
  cpu::gemm(false, false, M, N, K, 1.0f, ConstTypedPtr(a16.data(), DType::bf16), K, b.data(), N,
            0.0f, c1.data(), N);
  cpu::sgemm(false, false, M, N, K, 1.0f, a_rounded.data(), K, b.data(), N, 0.0f, c2.data(), N);
  EXPECT_EQ(c1, c2);
}

TEST(MixedGemm, RejectsBadStrides) {
  std::vector<uint16_t> a(16), b(16);
  std::vector<float> c(16);
  EXPECT_THROW(cpu::gemm(false, false, 4, 4, 4, 1.0f, ConstTypedPtr(a.data(), DType::bf16), 3,
                         ConstTypedPtr(b.data(), DType::bf16), 4, 0.0f, c.data(), 4),
               shardlm::Error);
}

// ---------------------------------------------------------------- kernels storing a compute type

template <typename Kernel>
void expect_rounded_once(Kernel&& kernel, size_t count, const std::string& what) {
  std::vector<float> f32(count);
  kernel(TypedPtr(f32.data()));
  for (DType t : {DType::bf16, DType::fp16}) {
    std::vector<uint16_t> half(count);
    kernel(TypedPtr(half.data(), t));
    for (size_t i = 0; i < count; ++i) {
      const uint16_t want = t == DType::bf16 ? float_to_bf16(f32[i]) : float_to_fp16(f32[i]);
      ASSERT_EQ(half[i], want) << what << " " << shardlm::dtype_name(t) << " element " << i;
    }
  }
}

TEST(ComputeTypeKernels, StoreTheFp32ResultRoundedOnce) {
  // The fp32 kernels are checked against naive doubles in test_cpu_kernels; here
  // their compute-type outputs must be exactly those results, rounded once.
  const int64_t N = 37;
  const int C = 72;
  const auto x = random_vec(N * C, 300), w = random_vec(C, 301), bias = random_vec(C, 302),
             branch = random_vec(N * C, 303);
  std::vector<float> mean(N), rstd(N), residual(N * C);
  expect_rounded_once([&](TypedPtr out) {
    cpu::layernorm_forward(out, mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);
  }, N * C, "layernorm");
  expect_rounded_once([&](TypedPtr out) {
    cpu::residual_layernorm_forward(residual.data(), out, mean.data(), rstd.data(), x.data(),
                                    branch.data(), bias.data(), w.data(), bias.data(), N, C);
  }, N * C, "residual layernorm");
  // GELU: the pre-activation is rounded first and GELU runs on the rounded value,
  // i.e. the compute-type result is the fp32 kernel's on the rounded input.
  const auto pre0 = random_vec(N * 4 * C, 304, 2.0), fc_bias = random_vec(4 * C, 305);
  for (DType t : {DType::bf16, DType::fp16}) {
    std::vector<float> x(pre0.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = round_to(t, pre0[i] + fc_bias[i % (4 * C)]);
    std::vector<float> want_pre = x, want_out(x.size());
    cpu::bias_gelu_forward(want_out.data(), want_pre.data(), want_pre.data(), nullptr, N, 4 * C);
    std::vector<uint16_t> pre16(x.size()), out16(x.size());
    cpu::bias_gelu_forward(TypedPtr(out16.data(), t), TypedPtr(pre16.data(), t),
                           pre0.data(), fc_bias.data(), N, 4 * C);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(round_to(t, want_pre[i]), want_pre[i]);
      const auto to_t = [&](float v) { return t == DType::bf16 ? float_to_bf16(v) : float_to_fp16(v); };
      ASSERT_EQ(pre16[i], to_t(want_pre[i])) << i;
      ASSERT_EQ(out16[i], to_t(want_out[i])) << i;
    }
    // The backward reads the stored pre-activation: the same as fp32 on the rounded values.
    const auto dout = random_vec(x.size(), 306);
    std::vector<float> want_din(x.size()), din(x.size());
    cpu::gelu_backward(want_din.data(), dout.data(), want_pre.data(), static_cast<int64_t>(x.size()));
    cpu::gelu_backward(din.data(), dout.data(), ConstTypedPtr(pre16.data(), t),
                       static_cast<int64_t>(x.size()));
    EXPECT_EQ(din, want_din) << shardlm::dtype_name(t);
  }
}

// ---------------------------------------------------------------- fused head in bf16

TEST(ComputeTypeKernels, Bf16LmHeadMatchesNaiveDouble) {
  const int N = 45, C = 40, V = 203, Vp = 256, chunk_rows = 16;
  const auto x = random_vec(static_cast<size_t>(N) * C, 400);
  const auto w = random_vec(static_cast<size_t>(Vp) * C, 401, 0.3);
  std::vector<int32_t> targets(N);
  shardlm::Rng rng(402);
  for (int n = 0; n < N; ++n) targets[n] = n % 6 == 1 ? -1 : static_cast<int32_t>(rng.below(V));
  std::vector<uint16_t> x16(x.size()), w16(w.size());
  std::vector<double> xr(x.size()), wr(w.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = float_to_bf16(x[i]), xr[i] = bf16_to_float(x16[i]);
  for (size_t i = 0; i < w.size(); ++i) w16[i] = float_to_bf16(w[i]), wr[i] = bf16_to_float(w16[i]);

  std::vector<float> logits(static_cast<size_t>(chunk_rows) * Vp);
  std::vector<uint16_t> dlogits16(logits.size());
  std::vector<float> losses(N), dx(static_cast<size_t>(N) * C), dw(static_cast<size_t>(Vp) * C, 0.0f);
  cpu::LmHeadLossArgs args;
  args.x = ConstTypedPtr(x16.data(), DType::bf16);
  args.weight = ConstTypedPtr(w16.data(), DType::bf16);
  args.targets = targets.data();
  args.N = N;
  args.C = C;
  args.V = V;
  args.grad_scale = 0.05f;
  args.logits_scratch = logits.data();
  args.logits_stride = Vp;
  args.chunk_rows = chunk_rows;
  args.dlogits_scratch = TypedPtr(dlogits16.data(), DType::bf16);
  cpu::lm_head_cross_entropy(args, losses.data(), dx.data(), dw.data());

  // Naive double head on the rounded inputs. The loss sees only fp32 accumulation
  // error; dx and dW also see dlogits rounded to bf16: at most u relative per term,
  // so |error| <= u * sum |dlogit * operand| (+ 5% for the fp32 part).
  std::vector<double> want_dx(dx.size(), 0.0), want_dw(dw.size(), 0.0), mag_dx(dx.size(), 0.0),
      mag_dw(dw.size(), 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) {
      EXPECT_EQ(losses[n], 0.0f);
      continue;
    }
    std::vector<double> l(V);
    double mx = -1e300, sum = 0.0;
    for (int v = 0; v < V; ++v) {
      for (int k = 0; k < C; ++k) l[v] += xr[n * C + k] * wr[v * C + k];
      mx = std::max(mx, l[v]);
    }
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    EXPECT_NEAR(losses[n], mx + std::log(sum) - l[targets[n]], 2e-5) << "row " << n;
    for (int v = 0; v < V; ++v) {
      const double g = args.grad_scale * (std::exp(l[v] - mx) / sum - (v == targets[n]));
      for (int k = 0; k < C; ++k) {
        want_dx[n * C + k] += g * wr[v * C + k];
        mag_dx[n * C + k] += std::fabs(g * wr[v * C + k]);
        want_dw[v * C + k] += g * xr[n * C + k];
        mag_dw[v * C + k] += std::fabs(g * xr[n * C + k]);
      }
    }
  }
  for (size_t i = 0; i < dx.size(); ++i)
    ASSERT_NEAR(dx[i], want_dx[i], kBf16Unit * mag_dx[i] * 1.05 + 1e-9) << "dx " << i;
  for (size_t i = 0; i < dw.size(); ++i)
    ASSERT_NEAR(dw[i], want_dw[i], kBf16Unit * mag_dw[i] * 1.05 + 1e-9) << "dw " << i;
  for (size_t i = static_cast<size_t>(V) * C; i < dw.size(); ++i) ASSERT_EQ(dw[i], 0.0f);
}

// ---------------------------------------------------------------- the model

struct FixtureRun {
  double loss = 0.0;
  std::vector<std::pair<std::string, double>> grad_errors;  // relative-to-max vs PyTorch
  std::vector<std::vector<float>> grads;                     // per flat unit
};

// params_in_compute_type: hand the model its parameters already converted to the
// compute type (as ZeRO-3 gathers them) instead of the fp32 values.
FixtureRun run_fixture(DType precision, bool params_in_compute_type = false) {
  namespace st = shardlm::safetensors;
  const st::File file = st::read_file(std::string(SHARDLM_FIXTURE_DIR) + "/gpt2_fixture.safetensors");
  const auto config = shardlm::ModelConfig::from_json(nlohmann::json::parse(file.metadata.at("config")));
  const auto batch = nlohmann::json::parse(file.metadata.at("batch"));
  const int B = batch.at("B").get<int>(), T = batch.at("T").get<int>();
  std::vector<int32_t> tokens, targets;
  for (auto v : file.at("tokens").to_i64()) tokens.push_back(static_cast<int32_t>(v));
  for (auto v : file.at("targets").to_i64()) targets.push_back(static_cast<int32_t>(v));
  const auto layout = shardlm::ParamLayout::build(config, 1);
  std::vector<std::vector<float>> params, grads;
  for (const auto& unit : layout.units) {
    params.emplace_back(unit.padded_numel, 0.0f);
    grads.emplace_back(unit.padded_numel, 0.0f);
  }
  std::vector<float*> pp, gp;
  for (const auto& place : layout.model_units) {
    pp.push_back(params[place.unit].data() + place.base);
    gp.push_back(grads[place.unit].data() + place.base);
  }
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const auto values = file.at(p->name).to_f32();
    std::copy(values.begin(), values.end(), params[unit].begin() + info->offset);
  }
  int64_t count = 0;
  for (int32_t t : targets) count += t != shardlm::kIgnoreIndex;
  std::vector<std::vector<uint16_t>> converted;
  std::vector<ConstTypedPtr> typed;
  for (const auto& unit : params) {
    converted.emplace_back(unit.size());
    cpu::convert(TypedPtr(converted.back().data(), precision), unit.data(),
                 static_cast<int64_t>(unit.size()));
  }
  for (size_t m = 0; m < pp.size(); ++m) {
    const auto& place = layout.model_units[m];
    typed.push_back(params_in_compute_type
                        ? ConstTypedPtr(converted[place.unit].data(), precision).at(place.base)
                        : ConstTypedPtr(pp[m]));
  }
  const shardlm::ParamPointers typed_params(typed);
  shardlm::Gpt2Model model(config, layout, B, T, {precision, false});
  const shardlm::MicroBatch micro{tokens.data(), targets.data(), B, T};
  // As training runs fp16: the loss scaled by a power of two (exact), so small
  // activation gradients stay above fp16's normal range; divided out below.
  const float loss_scale = 1024.0f;
  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, typed_params, gp, micro, true, loss_scale / static_cast<float>(count));
  for (int u = model.num_units() - 1; u >= 0; --u) model.backward_unit(u, typed_params, gp, micro);
  FixtureRun r;
  r.grads = grads;
  r.loss = model.last_loss_sum() / static_cast<double>(count);
  for (const auto* p : layout.all_params()) {
    const auto want = file.at(p->name + ".grad").to_f32();
    const auto [unit, info] = layout.find(p->name);
    double max_ref = 0.0, max_diff = 0.0;
    for (int64_t i = 0; i < info->numel; ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
      const double got = static_cast<double>(grads[unit][info->offset + i]) / loss_scale;
      max_diff = std::max(max_diff, std::fabs(got - want[i]));
    }
    r.grad_errors.push_back({p->name, max_diff / max_ref});
  }
  return r;
}

TEST(MixedPrecisionModel, Bf16AndFp16GradientsMatchPyTorchWithinTheFormatsPrecision) {
  namespace st = shardlm::safetensors;
  const st::File file = st::read_file(std::string(SHARDLM_FIXTURE_DIR) + "/gpt2_fixture.safetensors");
  const double want_loss = file.at("loss").to_f32()[0];
  for (DType precision : {DType::bf16, DType::fp16}) {
    const double u = precision == DType::bf16 ? kBf16Unit : kFp16Unit;
    const FixtureRun r = run_fixture(precision);
    // The loss is a mean over tokens of values each perturbed by a few roundings of
    // u in random directions: well within u.
    EXPECT_NEAR(r.loss, want_loss, u * want_loss) << shardlm::dtype_name(precision);
    // The longest path (the first block's gradients) crosses ~30 roundings of at
    // most u each (every stored activation and rounded weight of the blocks above
    // it, forward and backward, and the head's). Independent roundings add like a
    // random walk, sqrt(30) u ~ 5.5 u, and a tensor's worst element sits in the
    // tail: 16 u relative to the tensor's largest gradient (6.3% bf16, 0.8% fp16).
    double worst = 0.0;
    for (const auto& [name, err] : r.grad_errors) {
      EXPECT_LT(err, 16 * u) << shardlm::dtype_name(precision) << " " << name;
      worst = std::max(worst, err);
    }
    std::printf("%s: loss %.6f (PyTorch %.6f), worst gradient error %.4f (bound %.4f)\n",
                std::string(shardlm::dtype_name(precision)).c_str(), r.loss, want_loss, worst,
                16 * u);
  }
}

// ZeRO-3 hands the model parameters gathered in the compute type; the other strategies
// hand it fp32 masters that it rounds itself. Both must compute the same bits, or the
// strategies would stop being interchangeable under mixed precision.
TEST(MixedPrecisionModel, ParamsInTheComputeTypeGiveBitwiseTheResultOfFp32Params) {
  for (DType precision : {DType::bf16, DType::fp16}) {
    const FixtureRun from_fp32 = run_fixture(precision, false);
    const FixtureRun from_compute_type = run_fixture(precision, true);
    EXPECT_EQ(from_fp32.loss, from_compute_type.loss) << shardlm::dtype_name(precision);
    ASSERT_EQ(from_fp32.grads.size(), from_compute_type.grads.size());
    for (size_t u = 0; u < from_fp32.grads.size(); ++u)
      EXPECT_EQ(0, std::memcmp(from_fp32.grads[u].data(), from_compute_type.grads[u].data(),
                               from_fp32.grads[u].size() * sizeof(float)))
          << shardlm::dtype_name(precision) << " unit " << u;
  }
}

// In a bf16 run the replicated strategies hand the model a bf16 copy of their fp32
// parameters: it must hold exactly the rounded masters before the first forward,
// after every optimizer step (ddp: written by AdamW through OwnedSlice::compute_copy;
// zero1: rebuilt from the gathered masters), and after a load, never a stale copy.
TEST(MixedPrecisionStrategy, ReplicatedParamsReachTheModelRoundedToBf16AfterEveryUpdate) {
  const auto config = shardlm::model_preset("gpt2-tiny");
  const auto layout = shardlm::ParamLayout::build(config, 1);
  shardlm::Gpt2Model model(config, layout, 1, 4, {DType::bf16, false});
  std::vector<std::vector<int>> needs;
  for (int m = 0; m < model.num_units(); ++m) needs.push_back(model.units_needed_for(m));
  for (auto kind : {shardlm::StrategyKind::ddp, shardlm::StrategyKind::zero1}) {
    const std::string name = shardlm::to_string(kind);
    shardlm::SingleProcessCommunicator comm;
    shardlm::StrategyOptions options;
    options.kind = kind;
    options.param_dtype = DType::bf16;
    shardlm::FlatUnitStrategy strategy(layout, needs, comm, options);
    auto fill = [&](uint64_t seed, bool masters) {
      shardlm::Rng rng(seed);
      for (int u = 0; u < layout.num_units(); ++u) {
        const shardlm::OwnedSlice s = strategy.owned(u);
        for (int64_t i = 0; i < s.size(); ++i)
          (masters ? s.master : s.grad)[i] = static_cast<float>(rng.uniform() - 0.5);
      }
    };
    auto expect_rounded_copies = [&](const std::string& when) {
      for (int m = 0; m < model.num_units(); ++m) strategy.before_forward(m, false);
      const auto params = strategy.params();
      for (int m = 0; m < model.num_units(); ++m) {
        const auto& place = layout.model_units[static_cast<size_t>(m)];
        ASSERT_EQ(params[static_cast<size_t>(m)].dtype, DType::bf16) << when;
        // The whole flat unit the model unit lies in, from its start.
        const auto* copy = static_cast<const uint16_t*>(params[static_cast<size_t>(m)].data) -
                           place.base;
        const float* master = strategy.replicated_params(place.unit);
        for (int64_t i = 0; i < layout.units[static_cast<size_t>(place.unit)].padded_numel; ++i)
          ASSERT_EQ(copy[i], shardlm::float_to_bf16(master[i]))
              << when << ": unit " << place.unit << " element " << i;
      }
    };
    fill(1, true);
    strategy.after_load();
    expect_rounded_copies(name + ", after load");
    for (int step = 1; step <= 2; ++step) {  // AdamW steps, as the trainer takes them
      strategy.begin_step(1);
      fill(10 + static_cast<uint64_t>(step), false);
      for (int u = 0; u < layout.num_units(); ++u) {
        const shardlm::OwnedSlice s = strategy.owned(u);
        EXPECT_EQ(s.compute_copy.data != nullptr, kind == shardlm::StrategyKind::ddp) << name;
        const auto decay = shardlm::weight_decay_ranges(layout.units[static_cast<size_t>(u)],
                                                        s.begin, s.end);
        shardlm::adamw_update(s.master, s.grad, s.adam_m, s.adam_v, s.size(), decay, 1e-2f,
                              1.0f, step, shardlm::AdamWConfig{}, s.compute_copy);
      }
      strategy.after_step();
      expect_rounded_copies(name + ", after AdamW step " + std::to_string(step));
    }
    fill(3, true);  // masters changed outside the optimizer: after_load rebuilds
    strategy.after_load();
    expect_rounded_copies(name + ", after a second load");
  }
}

TEST(MixedPrecisionModel, RejectsParamsOfAnotherType) {
  const auto config = shardlm::model_preset("gpt2-tiny");
  const auto layout = shardlm::ParamLayout::build(config, 1);
  shardlm::Gpt2Model model(config, layout, 1, 4, {DType::bf16, false});
  std::vector<uint16_t> unit0(static_cast<size_t>(layout.units[0].padded_numel));
  std::vector<ConstTypedPtr> params(static_cast<size_t>(model.num_units()));
  params[0] = ConstTypedPtr(unit0.data(), DType::fp16);
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  const shardlm::MicroBatch micro{tokens.data(), nullptr, 1, 4};
  try {
    model.forward_unit(0, shardlm::ParamPointers(params), {}, micro, false, 1.0f);
    FAIL() << "fp16 parameters were accepted by a bf16 model";
  } catch (const shardlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a bf16 run takes fp32 or bf16"), std::string::npos)
        << e.what();
  }
}

}  // namespace
