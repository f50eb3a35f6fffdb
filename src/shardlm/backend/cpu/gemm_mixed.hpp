// GEMM on dtype-tagged operands with fp32 accumulation and an fp32 result:
//   C[M,N] (fp32) = alpha * op(A)[M,K] * op(B)[K,N] + beta * C
// with the conventions of cpu::sgemm (row-major, strides in elements, beta == 0
// overwrites C without reading it).
//
// How each operand pair runs:
//   fp32 x fp32  cpu::sgemm (bit for bit the fp32 path).
//   bf16 x bf16  oneDNN's matmul primitive (public API; oneDNN 2.6 exports no bf16
//                gemm function): avx512_bf16 dot products where the CPU has them,
//                oneDNN's emulation on plain AVX-512. Primitives are created once per
//                shape and cached. The operands are described so that oneDNN runs its
//                JIT GEMM kernel, measured faster here than the brgemm kernel it
//                picks for dense operands (gemm_mixed.cpp, docs/gemm.md);
//                SHARDLM_BF16_MATMUL=dense lets it pick (for benchmarking).
//   otherwise    (fp16 anywhere, mixed types, or a CPU where oneDNN has no bf16
//                matmul): every non-fp32 operand is widened into an fp32 scratch and
//                cpu::sgemm runs. Widening is exact, so the result is the product of
//                the rounded inputs accumulated in fp32, as on hardware that has the
//                type. The scratch grows to the largest operand once and is reused.
#pragma once

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, ConstTypedPtr A, int lda,
          ConstTypedPtr B, int ldb, float beta, float* C, int ldc);

// How bf16 x bf16 products run. kAuto: oneDNN's matmul when it has a bf16
// implementation on this CPU (its JIT GEMM kernel, or with SHARDLM_BF16_MATMUL=dense
// the kernel oneDNN picks for dense operands), else kWidenToFp32. Tests force each path.
enum class Bf16GemmPath { kAuto, kOneDnnMatmul, kOneDnnMatmulDense, kWidenToFp32 };

void gemm_on(Bf16GemmPath path, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             ConstTypedPtr A, int lda, ConstTypedPtr B, int ldb, float beta, float* C, int ldc);

// Whether oneDNN runs bf16 matmuls on this CPU (natively or emulated), and the
// implementation it picked ("brg:avx512_core_bf16", ...; "none" when it has none).
bool onednn_has_bf16_matmul();
const char* onednn_bf16_matmul_impl();

}  // namespace shardlm::cpu
