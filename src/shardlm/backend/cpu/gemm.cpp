#include "shardlm/backend/cpu/gemm.hpp"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {
namespace {

// oneDNN wins the measured step-GEMM time on this machine (docs/gemm.md), and it
// picks its kernels from the CPU's features, so it does not depend on
// OPENBLAS_CORETYPE, and it threads with the same OpenMP runtime as shardlm.
constexpr GemmLibrary kDefaultLibrary = GemmLibrary::kOneDnn;

GemmLibrary library_from_environment() {
  const char* value = std::getenv("SHARDLM_GEMM");
  if (value == nullptr || *value == '\0') return kDefaultLibrary;
  return gemm_library_from_name(value);
}

// Debian's OpenBLAS is the pthread build: it keeps its own thread pool, sized from
// the machine unless told otherwise. Keep it at OpenMP's count so a GEMM never runs
// more threads than shardlm's kernels (which would oversubscribe the cores).
void match_openblas_threads_to_openmp() {
  static std::atomic<int> openblas_threads{0};
  const int wanted = omp_get_max_threads();
  if (openblas_threads.load(std::memory_order_relaxed) != wanted) {
    openblas_set_num_threads(wanted);
    openblas_threads.store(wanted, std::memory_order_relaxed);
  }
}

void scale_rows(int M, int N, float beta, float* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    float* row = C + static_cast<long>(i) * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else {
      for (int j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

}  // namespace

GemmLibrary gemm_library_from_name(const char* name) {
  const std::string_view value(name);
  if (value == "onednn") return GemmLibrary::kOneDnn;
  if (value == "openblas") return GemmLibrary::kOpenBlas;
  throw Error(fmt::format("SHARDLM_GEMM={} is not a GEMM library; expected onednn or openblas",
                          value));
}

GemmLibrary active_gemm_library() {
  static const GemmLibrary library = library_from_environment();
  return library;
}

const char* gemm_library_name(GemmLibrary library) {
  switch (library) {
    case GemmLibrary::kOneDnn: return "oneDNN";
    case GemmLibrary::kOpenBlas: return "OpenBLAS";
  }
  return "unknown";
}

const char* gemm_library_name() { return gemm_library_name(active_gemm_library()); }

void check_gemm_arguments(const char* what, bool trans_a, bool trans_b, int M, int N, int K,
                          int lda, int ldb, int ldc) {
  SHARDLM_CHECK(M >= 0 && N >= 0 && K >= 0, "{}: sizes M={} N={} K={} must be >= 0", what, M, N, K);
  const int a_cols = trans_a ? M : K;
  const int b_cols = trans_b ? K : N;
  SHARDLM_CHECK(lda >= std::max(1, a_cols) && ldb >= std::max(1, b_cols) && ldc >= std::max(1, N),
                "{}: row strides lda={} ldb={} ldc={} must be >= the stored row lengths "
                "{} {} {}",
                what, lda, ldb, ldc, a_cols, b_cols, N);
}

void sgemm_on(GemmLibrary library, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
              const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const PhaseScope phase(Phase::gemm);
  check_gemm_arguments("sgemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta * C; libraries differ on whether they accept K = 0
    scale_rows(M, N, beta, C, ldc);
    return;
  }
  switch (library) {
    case GemmLibrary::kOneDnn: {
      // oneDNN's OpenMP build reads omp_get_max_threads() on every call.
      const dnnl_status_t status =
          dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                     beta, C, ldc);
      SHARDLM_CHECK(status == dnnl_success, "sgemm: oneDNN dnnl_sgemm failed with status {} "
                    "for M={} N={} K={}", static_cast<int>(status), M, N, K);
      return;
    }
    case GemmLibrary::kOpenBlas:
      match_openblas_threads_to_openmp();
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                  ldc);
      return;
  }
}

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  sgemm_on(active_gemm_library(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace shardlm::cpu
