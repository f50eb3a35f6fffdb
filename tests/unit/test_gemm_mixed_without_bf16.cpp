// The mixed GEMM on a CPU without bf16 support: oneDNN is capped at AVX2 (it then
// has no bf16 matmul) before anything in this process uses it, so gemm() must fall
// back to widening its inputs to fp32 and still give the product of the rounded
// inputs. A separate executable, because the cap holds for the whole process.
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"

namespace {

namespace cpu = shardlm::cpu;
using namespace shardlm;  // dtypes and scalar conversions (core/dtype.hpp)

class CapIsaAtAvx2 : public ::testing::Environment {
 public:
  void SetUp() override { status = dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2); }
  static inline dnnl_status_t status = dnnl_success;
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new CapIsaAtAvx2);

TEST(MixedGemmWithoutBf16, FallsBackToWideningAndMatchesNaiveDouble) {
  ASSERT_EQ(CapIsaAtAvx2::status, dnnl_success) << "could not cap oneDNN's ISA";
  EXPECT_FALSE(cpu::onednn_has_bf16_matmul()) << cpu::onednn_bf16_matmul_impl();
  const int M = 33, N = 47, K = 65;
  shardlm::Rng rng(7);
  std::vector<uint16_t> a(static_cast<size_t>(K) * M), b(static_cast<size_t>(K) * N);
  std::vector<double> ar(a.size()), br(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float_to_bf16(static_cast<float>(rng.normal()));
    ar[i] = bf16_to_float(a[i]);
  }
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = float_to_bf16(static_cast<float>(rng.normal()));
    br[i] = bf16_to_float(b[i]);
  }
  std::vector<float> c(static_cast<size_t>(M) * N, 1.0f);
  // C = A^T B + C, A stored [K, M].
  cpu::gemm(true, false, M, N, K, 1.0f, ConstTypedPtr(a.data(), shardlm::DType::bf16), M,
            ConstTypedPtr(b.data(), shardlm::DType::bf16), N, 1.0f, c.data(), N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 1.0, magnitude = 1.0;
      for (int k = 0; k < K; ++k) {
        want += ar[static_cast<size_t>(k) * M + m] * br[static_cast<size_t>(k) * N + n];
        magnitude += std::fabs(ar[static_cast<size_t>(k) * M + m] * br[static_cast<size_t>(k) * N + n]);
      }
      ASSERT_NEAR(c[static_cast<size_t>(m) * N + n], want, (K + 2) * 6e-8 * magnitude) << m << "," << n;
    }
  // Forcing oneDNN's matmul here is an error that says so, not a wrong result.
  EXPECT_THROW(cpu::gemm_on(cpu::Bf16GemmPath::kOneDnnMatmul, false, false, 2, 2, 2, 1.0f,
                            ConstTypedPtr(a.data(), shardlm::DType::bf16), 2,
                            ConstTypedPtr(b.data(), shardlm::DType::bf16), 2, 0.0f, c.data(), 2),
               shardlm::Error);
}

}  // namespace
