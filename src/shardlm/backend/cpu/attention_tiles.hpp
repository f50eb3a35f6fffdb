// The tiled building blocks of the CPU attention kernels (attention.cpp's whole-row
// causal attention and attention_block.cpp's ring blocks): fp32 tiles of kBlock rows,
// register-blocked tile products, storage types that widen on load, and the online
// softmax of one score row. Internal to backend/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/vector_math.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm::cpu::attention_tiles {

// Tiles of kBlock queries x kBlock keys. (Whole-row attention aligns query and key
// blocks to the same grid, so only its diagonal tiles straddle the causal boundary.)
inline constexpr int kBlock = 64;

// One vector register of floats (GCC/Clang vector extension), so the tile products
// below keep an accumulator block in registers, which plain loops do not get. The
// register file decides the block (kTileRows x kTileVectors vectors):
//  - AVX-512: 16 floats (zmm); 6 x 4 vectors: 24 accumulators + 4 B vectors + a
//    broadcast fit the 32 zmm registers (~15% faster than four rows on 64 x 64 x 64).
//  - otherwise (AVX2): 8 floats (ymm); 6 x 2 vectors: 12 accumulators + 2 B vectors +
//    a broadcast fit the 16 ymm registers. 64-byte vectors there make GCC 12 keep
//    every value in memory (one layer of GPT-2 124M, B x T = 1 x 1024, fp32, 2 threads
//    on a Zen 3: 854 ms forward + backward with the AVX-512 block, 146 ms with this
//    one; 4 x 3, 5 x 2 and 8 x 1 blocks of ymm: 173-186 ms; with the explicit
//    broadcast below and the vector softmax, 55 ms).
// Each element's sum runs over k in order, one fused multiply-add per term, whatever
// the blocking, so the results do not depend on it.
#ifdef __AVX512F__
inline constexpr int kTileRows = 6;
inline constexpr int kTileVectors = 4;
#else
inline constexpr int kTileRows = 6;
inline constexpr int kTileVectors = 2;
#endif
// The register-wide vectors of vector_math.hpp (their lane count follows the same rule).
inline constexpr int kVecLanes = kNativeLanes;
using FloatVec = NativeFloats;
using IntVec = NativeInts;
inline FloatVec load_vec(const float* p) { return load_native(p); }
inline void store_vec(float* p, FloatVec v) { store_native(p, v); }

// 0, 1, ..., kVecLanes - 1.
inline const IntVec kLaneIndex = [] {
  IntVec index;
  for (int l = 0; l < kVecLanes; ++l) index[l] = l;
  return index;
}();

// All lanes true (-1) where j0 + lane lies in [first, valid), else 0.
inline IntVec lanes_within(int j0, int first, int valid) {
  const IntVec j = kLaneIndex + j0;
  return (j >= first) & (j < valid);
}

// exp_approx lane by lane (vector_math.hpp): in an `omp simd` loop GCC 12 leaves
// exp_approx's clamps scalar, which made the softmax of a tile cost about as much as
// its two products.
inline FloatVec exp_vec(FloatVec x) { return exp_approx_vector<FloatVec, IntVec>(x); }

// acc + a * b rounded once. With ymm vectors GCC's Zen tuning (avoid-fma-max-bits)
// leaves a single accumulator chain as a multiply and an add (tile_kernel<1, 1>, and
// the scalar column tail): the explicit FMA keeps every element one fused multiply-add
// per k, whatever the block. The explicit broadcast of a: written as a vector sum
// (FloatVec{} + a), GCC adds 0 to every scalar before broadcasting it (-0 + 0 is +0),
// which cost 1.7x in forward + backward.
inline FloatVec fused_multiply_add(float a, FloatVec b, FloatVec acc) {
#if !defined(__AVX512F__) && defined(__FMA__)
  return _mm256_fmadd_ps(_mm256_set1_ps(a), b, acc);
#else
  return acc + a * b;
#endif
}
inline float fused_multiply_add(float a, float b, float acc) {
#if !defined(__AVX512F__) && defined(__FMA__)
  return std::fma(a, b, acc);
#else
  return acc + a * b;
#endif
}

// C[MR x kVecLanes*NV] += A[MR x k] B[k x kVecLanes*NV], with A(r, kk) = a[r * a_rs + kk * a_cs]
// (so A may be read transposed) and B's rows contiguous at stride ldb.
template <int MR, int NV>
inline void tile_kernel(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                        const float* b, int64_t ldb, int k) {
  // Every caller has k >= 1. Telling GCC so keeps the accumulators in registers: for
  // the k = 0 path it otherwise routes them through the stack around the loop.
  if (k < 1) __builtin_unreachable();
  FloatVec acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = load_vec(c + r * ldc + v * kVecLanes);
  for (int kk = 0; kk < k; ++kk) {
    FloatVec bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load_vec(b + kk * ldb + v * kVecLanes);
    for (int r = 0; r < MR; ++r) {
      const float av = a[r * a_rs + kk * a_cs];
      for (int v = 0; v < NV; ++v)
        acc[r][v] = fused_multiply_add(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) store_vec(c + r * ldc + v * kVecLanes, acc[r][v]);
}

// The last `vectors` (< kTileVectors) whole vectors of a row block: tile_kernel<MR, vectors>.
template <int MR, int NV>
inline void tile_remainder(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                           const float* b, int64_t ldb, int k, int vectors) {
  if constexpr (NV > 0) {
    if (vectors == NV)
      tile_kernel<MR, NV>(c, ldc, a, a_rs, a_cs, b, ldb, k);
    else
      tile_remainder<MR, NV - 1>(c, ldc, a, a_rs, a_cs, b, ldb, k, vectors);
  }
}

template <int MR>
inline void tile_row_block(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                           const float* b, int64_t ldb, int n, int k) {
  int col = 0;
  for (; col + kTileVectors * kVecLanes <= n; col += kTileVectors * kVecLanes)
    tile_kernel<MR, kTileVectors>(c + col, ldc, a, a_rs, a_cs, b + col, ldb, k);
  const int vectors = (n - col) / kVecLanes;
  tile_remainder<MR, kTileVectors - 1>(c + col, ldc, a, a_rs, a_cs, b + col, ldb, k, vectors);
  col += vectors * kVecLanes;
  // Columns beyond a multiple of kVecLanes (odd head_dim, ...): plain loops.
  for (int r = 0; r < MR; ++r)
    for (int kk = 0; kk < k; ++kk) {
      const float av = a[r * a_rs + kk * a_cs];
      for (int j = col; j < n; ++j)
        c[r * ldc + j] = fused_multiply_add(av, b[kk * ldb + j], c[r * ldc + j]);
    }
}

// C[m x n] += A[m x k] B[k x n] for the small tiles of attention (A as above). With
// causal_columns (a score tile on the causal diagonal: row r is query i0 + r, column j
// key i0 + j) each group of rows stops at the first vector of columns past its last
// row's key: the later columns are masked for every row of the group, so they keep
// what C held (no reader uses them).
inline void tile_gemm(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
               int64_t ldb, int m, int n, int k, bool causal_columns = false) {
  static_assert(kTileRows == 6, "the switch below dispatches up to six rows");
  for (int r = 0; r < m; r += kTileRows) {
    const int rows = std::min(kTileRows, m - r);
    const int cols = causal_columns ? std::min(n, (r + rows + kVecLanes - 1) / kVecLanes * kVecLanes) : n;
    float* c_rows = c + r * ldc;
    const float* a_rows = a + r * a_rs;
    switch (rows) {
      case 6: tile_row_block<6>(c_rows, ldc, a_rows, a_rs, a_cs, b, ldb, cols, k); break;
      case 5: tile_row_block<5>(c_rows, ldc, a_rows, a_rs, a_cs, b, ldb, cols, k); break;
      case 4: tile_row_block<4>(c_rows, ldc, a_rows, a_rs, a_cs, b, ldb, cols, k); break;
      case 3: tile_row_block<3>(c_rows, ldc, a_rows, a_rs, a_cs, b, ldb, cols, k); break;
      case 2: tile_row_block<2>(c_rows, ldc, a_rows, a_rs, a_cs, b, ldb, cols, k); break;
      default: tile_row_block<1>(c_rows, ldc, a_rows, a_rs, a_cs, b, ldb, cols, k); break;
    }
  }
}

// How qkv and out are stored: fp32, or a 16-bit compute type that the kernels widen
// to fp32 as they load it (exact) and round once when they store. The arithmetic is
// fp32 in every case, on the stored values, so the backward sees what the forward used.
struct Fp32Storage {
  using Elem = float;
  static float widen(float v) { return v; }
  static float narrow(float v) { return v; }
};
struct Bf16Storage {
  using Elem = uint16_t;
  static float widen(uint16_t v) { return bf16_to_float(v); }
  static uint16_t narrow(float v) { return float_to_bf16(v); }
};
struct Fp16Storage {
  using Elem = uint16_t;
  static float widen(uint16_t v) { return fp16_to_float(v); }
  static uint16_t narrow(float v) { return float_to_fp16(v); }
};

// dst[d * kBlock + j] = src[j * src_stride + d] for j < rows; zero for the rest of
// the block, so full-width score rows stay well defined.
template <typename S>
inline void transpose_block(float* dst, const typename S::Elem* src, int64_t src_stride, int rows,
                     int hd) {
  for (int d = 0; d < hd; ++d) {
    float* dst_row = dst + d * kBlock;
    for (int j = 0; j < rows; ++j) dst_row[j] = S::widen(src[j * src_stride + d]);
    for (int j = rows; j < kBlock; ++j) dst_row[j] = 0.0f;
  }
}

// Copies rows x hd values of a strided tensor into the contiguous fp32 `tile` (row
// stride hd), widening 16-bit storage; returns tile. The tile products read blocks
// from tiles, not in place: 64 rows at the tensor's stride (3C or C floats) can fall
// into a few L1 sets (3C = 2304: every 4th row in the same sets) and thrash L1.
template <typename S>
inline const float* load_tile(float* tile, const typename S::Elem* src, int64_t stride, int rows, int hd) {
  for (int r = 0; r < rows; ++r) {
    const typename S::Elem* in = src + r * stride;
    float* dst = tile + r * hd;
#pragma omp simd
    for (int d = 0; d < hd; ++d) dst[d] = S::widen(in[d]);
  }
  return tile;
}

// Scores of a tile: s[ii][j] = q_ii . k_j for the nq rows of the query tile q ([nq, hd]),
// all kBlock columns of the transposed key block k_t (on the causal diagonal, the
// columns tile_gemm's causal_columns skips are left zero).
inline void tile_scores(float* s, const float* q, const float* k_t, int nq, int hd, bool diagonal) {
  std::fill(s, s + nq * kBlock, 0.0f);
  tile_gemm(s, kBlock, q, hd, 1, k_t, kBlock, nq, kBlock, hd, diagonal);
}

// One key block of the online softmax (as fast_math's online_softmax_block) for the
// keys [first, valid) of one score row p of a tile: on return p[j] = e^(p[j] scale - m)
// with m the row's new running max for those keys, 0 for the others, and row_max /
// row_sum updated (the old sum rescaled to the new max). Returns that rescaling factor
// for the row's output accumulator; a row that sees none of the block's keys keeps its
// statistics (factor 1). The exponentials run a vector at a time; the block's sum runs
// over the keys in order.
inline float softmax_visible_keys(float* p, int first, int valid, float scale, float& row_max,
                                  float& row_sum) {
  if (first >= valid) {
    std::fill(p, p + kBlock, 0.0f);
    return 1.0f;
  }
  // max_j(p_j * scale) == max_j(p_j) * scale exactly (scale > 0, rounding monotone).
  const float block_max = max_of(p + first, valid - first) * scale;
  const float new_max = std::max(row_max, block_max);
  const FloatVec scale_v = FloatVec{} + scale, max_v = FloatVec{} + new_max;
  for (int j0 = 0; j0 < kBlock; j0 += kVecLanes) {
    const FloatVec e = exp_vec(load_vec(p + j0) * scale_v - max_v);
    store_vec(p + j0, lanes_within(j0, first, valid) ? e : FloatVec{});
  }
  float block_sum = 0.0f;
  for (int j = first; j < valid; ++j) block_sum += p[j];
  const float correction = exp_approx(row_max - new_max);
  row_sum = row_sum * correction + block_sum;
  row_max = new_max;
  return correction;
}

// Per-thread scratch for one head's operands in fp32 (contiguous rows, transposed key
// blocks): grows to the largest head once, then is reused (no allocation in steady state).
inline float* head_scratch(size_t floats) {
  thread_local TrackedBuffer buffer;
  return static_cast<float*>(buffer.grow_to(MemCategory::other, floats * sizeof(float)));
}

// Calls f with the storage type of `dtype` (a value of that type; only its type matters).
template <typename F>
inline void with_storage(DType dtype, F&& f) {
  switch (dtype) {
    case DType::fp32: f(Fp32Storage{}); return;
    case DType::bf16: f(Bf16Storage{}); return;
    case DType::fp16: f(Fp16Storage{}); return;
  }
}

}  // namespace shardlm::cpu::attention_tiles
