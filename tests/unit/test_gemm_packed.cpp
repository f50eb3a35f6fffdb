// gemm_packed (bf16 op(B) packed once, used by many calls) against a naive double GEMM
// written here, on odd shapes: K and N not multiples of the 32 x 64 packing blocks,
// every op(A) row count up to the packed-for maximum (and past it, which falls back to
// the plain operand), op(A) transposed or not, alpha and beta. Products of bf16 values
// are exact in fp32, so the only error is fp32 accumulation: checked against
// 1e-5 x sum |alpha a b| + |beta c| per element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/dtype.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/backend/cpu/gemm_packed.hpp"
#include "shardlm/core/rng.hpp"

namespace {

using shardlm::DType;
using shardlm::cpu::ConstTypedPtr;

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  shardlm::Rng rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = shardlm::cpu::float_to_bf16(static_cast<float>(rng.normal()));
  return v;
}

float at(const std::vector<uint16_t>& m, size_t i) { return shardlm::cpu::bf16_to_float(m[i]); }

struct Case {
  int N, K, max_rows;
  bool trans_b;
};

TEST(GemmPacked, MatchesNaiveDoubleForEveryRowCount) {
  bool packed_by_shardlm = false;
  for (const Case c : {Case{67, 37, 13, false}, Case{130, 65, 9, false}, Case{384, 300, 40, false},
                       Case{64, 32, 5, false}, Case{67, 37, 13, true}, Case{200, 70, 11, true}}) {
    // B stored [K, N] (or [N, K] when op(B) = B^T), with a row stride wider than a row.
    const int ldb = (c.trans_b ? c.K : c.N) + 3;
    const std::vector<uint16_t> B = random_bf16(static_cast<size_t>(c.trans_b ? c.N : c.K) * ldb, 1 + c.N);
    auto b_at = [&](int k, int n) {
      return at(B, c.trans_b ? static_cast<size_t>(n) * ldb + k : static_cast<size_t>(k) * ldb + n);
    };
    shardlm::cpu::PackedGemmOperand packed;
    const bool did_pack = packed.pack(c.trans_b, c.N, c.K, ConstTypedPtr(B.data(), DType::bf16), ldb,
                                      c.max_rows);
    EXPECT_EQ(did_pack, shardlm::cpu::onednn_has_bf16_matmul());
    packed_by_shardlm |= packed.packed_by_shardlm();
    for (int M = 1; M <= c.max_rows + 2; ++M) {
      for (const bool trans_a : {false, true}) {
        const float alpha = M % 3 == 0 ? 0.5f : 1.0f;
        const float beta = M % 2 == 0 ? 1.0f : 0.0f;
        const int lda = (trans_a ? M : c.K) + 1;
        const std::vector<uint16_t> A =
            random_bf16(static_cast<size_t>(trans_a ? c.K : M) * lda, 100 * M + c.K + trans_a);
        auto a_at = [&](int m, int k) {
          return at(A, trans_a ? static_cast<size_t>(k) * lda + m : static_cast<size_t>(m) * lda + k);
        };
        const int ldc = c.N + 2;
        std::vector<float> C(static_cast<size_t>(M) * ldc, 0.25f);
        const std::vector<float> C0 = C;
        shardlm::cpu::gemm_packed(trans_a, M, alpha, ConstTypedPtr(A.data(), DType::bf16), lda,
                                  packed, beta, C.data(), ldc);
        int bad = 0;
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < c.N; ++n) {
            double want = 0.0, magnitude = 0.0;
            for (int k = 0; k < c.K; ++k) {
              want += double(a_at(m, k)) * b_at(k, n);
              magnitude += std::fabs(double(a_at(m, k)) * b_at(k, n));
            }
            const size_t i = static_cast<size_t>(m) * ldc + n;
            want = alpha * want + beta * C0[i];
            const double tolerance = 1e-5 * (alpha * magnitude + std::fabs(beta * C0[i])) + 1e-30;
            if (std::fabs(C[i] - want) > tolerance && bad++ == 0)
              ADD_FAILURE() << "N=" << c.N << " K=" << c.K << " trans_b=" << c.trans_b << " M=" << M
                            << " trans_a=" << trans_a << " (" << m << ", " << n << "): got " << C[i]
                            << " want " << want;
          }
        EXPECT_EQ(bad, 0);
        for (int m = 0; m < M; ++m)  // the row padding of C is never written
          for (int n = c.N; n < ldc; ++n) ASSERT_EQ(C[static_cast<size_t>(m) * ldc + n], 0.25f);
      }
    }
  }
  // Where oneDNN runs bf16 matmuls with its avx512_core_bf16 brgemm, it picks the
  // BA16a64b2a layout for plain weights, which shardlm packs itself: the cases above
  // then cover that packer.
  if (std::string(shardlm::cpu::onednn_bf16_matmul_impl()) == "brg:avx512_core_bf16") {
    EXPECT_TRUE(packed_by_shardlm);
  }
}

TEST(GemmPacked, RepackingANewMatrixOfTheSameShapeIsUsed) {
  const int N = 70, K = 40, M = 6;
  std::vector<uint16_t> B = random_bf16(static_cast<size_t>(K) * N, 5);
  const std::vector<uint16_t> A = random_bf16(static_cast<size_t>(M) * K, 6);
  shardlm::cpu::PackedGemmOperand packed;
  std::vector<float> first(static_cast<size_t>(M) * N), second(first.size()), plain(first.size());
  packed.pack(false, N, K, ConstTypedPtr(B.data(), DType::bf16), N, M);
  shardlm::cpu::gemm_packed(false, M, 1.0f, ConstTypedPtr(A.data(), DType::bf16), K, packed, 0.0f,
                            first.data(), N);
  for (auto& x : B) x ^= 0x8000;  // negate B, repack in place
  packed.pack(false, N, K, ConstTypedPtr(B.data(), DType::bf16), N, M);
  shardlm::cpu::gemm_packed(false, M, 1.0f, ConstTypedPtr(A.data(), DType::bf16), K, packed, 0.0f,
                            second.data(), N);
  for (size_t i = 0; i < first.size(); ++i) ASSERT_EQ(second[i], -first[i]) << i;
}

}  // namespace
