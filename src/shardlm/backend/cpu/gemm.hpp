// Row-major single-precision GEMM behind one function, so the GEMM library is a
// measured choice (bench/gemm_bench) made in one place.
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C
// op(X) = X or X^T; lda/ldb/ldc are row strides of A, B, C as stored.
#pragma once

namespace shardlm::cpu {

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// Name of the library that runs sgemm (for logs and benchmark tables).
const char* gemm_library_name();

}  // namespace shardlm::cpu
