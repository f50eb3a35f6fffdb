// sgemm against a naive triple loop accumulating in double, on both libraries sgemm
// can run on: all four transpose combinations, odd shapes, row strides larger than
// the minimum, alpha/beta, and beta = 0 ignoring NaN garbage in C.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"

namespace {

using shardlm::cpu::GemmLibrary;

struct Case {
  bool trans_a, trans_b;
  int M, N, K;
  int lda_pad, ldb_pad, ldc_pad;  // extra elements per stored row beyond the minimum
  float alpha, beta;
};

std::vector<float> random_matrix(size_t n, uint64_t seed) {
  shardlm::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  return v;
}

// C = alpha * op(A) op(B) + beta * C in double; beta == 0 does not read C.
std::vector<double> reference(const Case& c, const std::vector<float>& A, int lda,
                              const std::vector<float>& B, int ldb, const std::vector<float>& C,
                              int ldc) {
  std::vector<double> out(static_cast<size_t>(c.M) * ldc);
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double sum = 0.0;
      for (int k = 0; k < c.K; ++k) {
        const double a = c.trans_a ? A[static_cast<size_t>(k) * lda + i]
                                   : A[static_cast<size_t>(i) * lda + k];
        const double b = c.trans_b ? B[static_cast<size_t>(j) * ldb + k]
                                   : B[static_cast<size_t>(k) * ldb + j];
        sum += a * b;
      }
      const size_t at = static_cast<size_t>(i) * ldc + j;
      out[at] = c.alpha * sum + (c.beta == 0.0f ? 0.0 : c.beta * static_cast<double>(C[at]));
    }
  return out;
}

void check_case(GemmLibrary library, const Case& c, bool nan_in_c = false) {
  const int a_cols = c.trans_a ? c.M : c.K, a_rows = c.trans_a ? c.K : c.M;
  const int b_cols = c.trans_b ? c.K : c.N, b_rows = c.trans_b ? c.N : c.K;
  const int lda = a_cols + c.lda_pad, ldb = b_cols + c.ldb_pad, ldc = c.N + c.ldc_pad;
  const auto A = random_matrix(static_cast<size_t>(a_rows) * lda, 11);
  const auto B = random_matrix(static_cast<size_t>(b_rows) * ldb, 22);
  auto C = random_matrix(static_cast<size_t>(c.M) * ldc, 33);
  if (nan_in_c)
    for (auto& x : C) x = std::numeric_limits<float>::quiet_NaN();
  const auto expected = reference(c, A, lda, B, ldb, C, ldc);
  const auto before = C;

  shardlm::cpu::sgemm_on(library, c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, A.data(), lda,
                         B.data(), ldb, c.beta, C.data(), ldc);

  const std::string label = std::string(shardlm::cpu::gemm_library_name(library)) +
                            (c.trans_a ? " A^T" : " A") + (c.trans_b ? " B^T " : " B ") +
                            std::to_string(c.M) + "x" + std::to_string(c.N) + "x" +
                            std::to_string(c.K);
  // fp32 products summed over K terms of magnitude <= 1: error grows like K * eps.
  const double tolerance = 1e-6 * (c.K + 4) * (std::abs(c.alpha) + std::abs(c.beta) + 1.0);
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i) * ldc + j;
      if (j < c.N) {
        ASSERT_NEAR(C[at], expected[at], tolerance) << label << " at (" << i << "," << j << ")";
      } else if (!nan_in_c) {  // padding between rows of C is never written
        ASSERT_EQ(C[at], before[at]) << label << " wrote padding at (" << i << "," << j << ")";
      }
    }
}

class SgemmTest : public ::testing::TestWithParam<GemmLibrary> {};

TEST_P(SgemmTest, AllTransposeCombinationsOnOddShapes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case(GetParam(), {ta, tb, 7, 13, 5, 0, 0, 0, 1.0f, 0.0f});
      check_case(GetParam(), {ta, tb, 1, 37, 19, 0, 0, 0, 1.0f, 0.0f});    // one row
      check_case(GetParam(), {ta, tb, 29, 1, 17, 0, 0, 0, 1.0f, 0.0f});    // one column
      check_case(GetParam(), {ta, tb, 33, 65, 1, 0, 0, 0, 1.0f, 0.0f});    // K = 1
      check_case(GetParam(), {ta, tb, 67, 129, 200, 0, 0, 0, 1.0f, 0.0f});  // blocked paths
    }
}

TEST_P(SgemmTest, RowStridesLargerThanTheMinimum) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case(GetParam(), {ta, tb, 7, 13, 5, 3, 5, 2, 1.0f, 0.0f});
      check_case(GetParam(), {ta, tb, 64, 48, 96, 17, 64, 9, 1.0f, 1.0f});
    }
}

TEST_P(SgemmTest, AlphaAndBetaScale) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case(GetParam(), {ta, tb, 11, 9, 23, 1, 2, 3, 0.125f, 0.0f});
      check_case(GetParam(), {ta, tb, 11, 9, 23, 0, 0, 0, -2.5f, 0.5f});
      check_case(GetParam(), {ta, tb, 40, 31, 50, 0, 0, 0, 1.0f, 1.0f});  // accumulate
    }
}

TEST_P(SgemmTest, BetaZeroIgnoresNanInC) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case(GetParam(), {ta, tb, 7, 13, 5, 0, 0, 0, 1.0f, 0.0f}, /*nan_in_c=*/true);
      check_case(GetParam(), {ta, tb, 70, 130, 50, 0, 0, 4, 0.5f, 0.0f}, /*nan_in_c=*/true);
    }
}

TEST_P(SgemmTest, BetaOneAccumulatesIntoC) {
  // Two calls with beta = 1 on a zeroed C give twice the product (gradient accumulation).
  const int M = 5, N = 6, K = 7;
  const auto A = random_matrix(M * K, 1), B = random_matrix(K * N, 2);
  std::vector<float> C(M * N, 0.0f);
  for (int call = 0; call < 2; ++call)
    shardlm::cpu::sgemm_on(GetParam(), false, false, M, N, K, 1.0f, A.data(), K, B.data(), N,
                           1.0f, C.data(), N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double sum = 0;
      for (int k = 0; k < K; ++k) sum += static_cast<double>(A[i * K + k]) * B[k * N + j];
      EXPECT_NEAR(C[i * N + j], 2.0 * sum, 1e-5) << "at (" << i << "," << j << ")";
    }
}

TEST_P(SgemmTest, KZeroScalesCByBeta) {
  std::vector<float> C = {1.0f, -2.0f, 3.0f, std::numeric_limits<float>::quiet_NaN()};
  const float unused = 0.0f;
  shardlm::cpu::sgemm_on(GetParam(), false, false, 1, 3, 0, 1.0f, &unused, 1, &unused, 3, 0.5f,
                         C.data(), 4);
  EXPECT_EQ(C[0], 0.5f);
  EXPECT_EQ(C[1], -1.0f);
  EXPECT_EQ(C[2], 1.5f);
  EXPECT_TRUE(std::isnan(C[3]));  // padding untouched
  std::vector<float> D = {std::numeric_limits<float>::quiet_NaN(), 7.0f};
  shardlm::cpu::sgemm_on(GetParam(), false, false, 1, 2, 0, 1.0f, &unused, 1, &unused, 2, 0.0f,
                         D.data(), 2);
  EXPECT_EQ(D[0], 0.0f);
  EXPECT_EQ(D[1], 0.0f);
}

TEST_P(SgemmTest, RejectsStridesShorterThanRows) {
  std::vector<float> buf(64, 0.0f);
  EXPECT_THROW(shardlm::cpu::sgemm_on(GetParam(), false, false, 4, 4, 4, 1.0f, buf.data(), 3,
                                      buf.data(), 4, 0.0f, buf.data(), 4),
               shardlm::Error);
  EXPECT_THROW(shardlm::cpu::sgemm_on(GetParam(), false, true, 4, 4, 4, 1.0f, buf.data(), 4,
                                      buf.data(), 4, 0.0f, buf.data(), 3),
               shardlm::Error);
}

INSTANTIATE_TEST_SUITE_P(Libraries, SgemmTest,
                         ::testing::Values(GemmLibrary::kOneDnn, GemmLibrary::kOpenBlas),
                         [](const auto& info) {
                           return std::string(info.param == GemmLibrary::kOneDnn ? "oneDNN"
                                                                                 : "OpenBLAS");
                         });

TEST(Sgemm, DefaultEntryPointMatchesTheNamedLibrary) {
  const std::string name = shardlm::cpu::gemm_library_name();
  EXPECT_TRUE(name == "oneDNN" || name == "OpenBLAS") << name;
  EXPECT_EQ(name, shardlm::cpu::gemm_library_name(shardlm::cpu::active_gemm_library()));
  const int M = 3, N = 4, K = 5;
  const auto A = random_matrix(M * K, 5), B = random_matrix(K * N, 6);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN());
  shardlm::cpu::sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double sum = 0;
      for (int k = 0; k < K; ++k) sum += static_cast<double>(A[i * K + k]) * B[k * N + j];
      EXPECT_NEAR(C[i * N + j], sum, 1e-5);
    }
}

TEST(Sgemm, LibraryNamesParseAndUnknownNamesAreRejected) {
  EXPECT_EQ(shardlm::cpu::gemm_library_from_name("onednn"), GemmLibrary::kOneDnn);
  EXPECT_EQ(shardlm::cpu::gemm_library_from_name("openblas"), GemmLibrary::kOpenBlas);
  try {
    shardlm::cpu::gemm_library_from_name("mkl");
    FAIL() << "an unknown library name was accepted";
  } catch (const shardlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("SHARDLM_GEMM=mkl"), std::string::npos) << e.what();
  }
}

}  // namespace
