#include "shardlm/backend/cpu/gemm.hpp"

#include <cblas.h>

namespace shardlm::cpu {

// Placeholder choice until bench/gemm_bench has measured oneDNN against OpenBLAS.
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const char* gemm_library_name() { return "OpenBLAS"; }

}  // namespace shardlm::cpu
