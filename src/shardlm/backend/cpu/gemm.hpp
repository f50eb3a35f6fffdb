// Row-major single-precision GEMM behind one function, so the GEMM library is a
// measured choice (bench/gemm_bench, docs/gemm.md) made in one place.
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C
// op(X) = X or X^T; lda/ldb/ldc are row strides of A, B, C as stored.
// beta == 0 overwrites C without reading it (NaN garbage in C is ignored).
//
// Threads: both libraries run on omp_get_max_threads() threads, the same count
// shardlm's own OpenMP kernels use, so GEMM and kernels never oversubscribe the cores.
#pragma once

namespace shardlm::cpu {

// Error naming `what` unless sizes are >= 0 and row strides cover the stored rows.
void check_gemm_arguments(const char* what, bool trans_a, bool trans_b, int M, int N, int K,
                          int lda, int ldb, int ldc);

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// Name of the library that runs sgemm (for logs and benchmark tables).
const char* gemm_library_name();

// The libraries sgemm can run on. The default is the measured winner (oneDNN);
// SHARDLM_GEMM=onednn|openblas overrides it, for benchmarking only.
enum class GemmLibrary { kOneDnn, kOpenBlas };

// The library sgemm uses: SHARDLM_GEMM if set (throws Error naming the variable
// on an unknown value), else the default. Read once per process.
GemmLibrary active_gemm_library();
const char* gemm_library_name(GemmLibrary library);
// "onednn" or "openblas" (SHARDLM_GEMM's values); throws Error naming SHARDLM_GEMM otherwise.
GemmLibrary gemm_library_from_name(const char* name);

// sgemm on a given library, for benchmarks and for tests that check both.
void sgemm_on(GemmLibrary library, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
              const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace shardlm::cpu
