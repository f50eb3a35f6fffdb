// A bf16 GEMM operand op(B) that many calls share (the LM head's weight, read by each
// row chunk's GEMMs), reordered once into the blocked layout oneDNN's matmul picks for
// it. A plain row-major B is repacked by oneDNN inside every call; with a head chunk of
// a few hundred rows that repacking is a visible part of the call (2 threads: the
// head's dx GEMM, 304 x 384 x 50257, ran at ~340 GFLOP/s plain and ~415 packed, for
// ~6 ms of packing per step; 256 x 768 x 50257 at ~390 and ~440 for ~8 ms).
//
//   PackedGemmOperand w(MemCategory::params, tracker);
//   w.pack(trans_b, N, K, B, ldb, max_rows);          // once per change of B
//   gemm_packed(trans_a, M, alpha, A, lda, w, beta, C, ldc);   // M <= max_rows, any times
//
// gemm_packed computes what gemm() computes with the plain B: C[M,N] (fp32) =
// alpha op(A)[M,K] op(B)[K,N] + beta C, fp32 accumulation. Where oneDNN has no bf16
// matmul (pack returns false) or no primitive for the packed layout at some M, it runs
// gemm() on the plain B, which must therefore stay valid while the packed copy is used.
#pragma once

#include <cstdint>
#include <memory>

#include "shardlm/backend/cpu/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm::cpu {

class PackedGemmOperand {
 public:
  explicit PackedGemmOperand(MemCategory category = MemCategory::other,
                             MemoryTracker& tracker = MemoryTracker::global());
  ~PackedGemmOperand();
  PackedGemmOperand(const PackedGemmOperand&) = delete;
  PackedGemmOperand& operator=(const PackedGemmOperand&) = delete;

  // Packs op(B) [K, N] of the bf16 matrix B (row stride ldb; op = transpose when
  // trans_b) for products with up to max_rows rows of op(A). The packed buffer is
  // allocated on the first pack of a shape and reused after. Returns whether a packed
  // copy exists (false: no bf16 matmul on this CPU, or B is not bf16).
  bool pack(bool trans_b, int N, int K, ConstTypedPtr B, int ldb, int max_rows);
  bool packed() const;
  // Whether the last pack wrote the layout itself (a plain B in the layout it knows,
  // BA16a64b2a) rather than through oneDNN's reorder; for tests.
  bool packed_by_shardlm() const;

  // Bytes pack() allocates for this shape (0 where it would not pack), without packing:
  // for memory plans.
  static int64_t packed_bytes(int N, int K, int max_rows);

 private:
  friend void gemm_packed(bool trans_a, int M, float alpha, ConstTypedPtr A, int lda,
                          const PackedGemmOperand& B, float beta, float* C, int ldc);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// C[M, N] (fp32, row stride ldc) = alpha op(A)[M, K] op(B) + beta C, with op(B) as last
// packed (N, K from the pack) and A bf16; beta == 0 overwrites C without reading it.
void gemm_packed(bool trans_a, int M, float alpha, ConstTypedPtr A, int lda,
                 const PackedGemmOperand& B, float beta, float* C, int ldc);

}  // namespace shardlm::cpu
