#include "shardlm/backend/cpu/attention_bf16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/core/memory_tracker.hpp"

// Everything below that touches the bf16 instructions is compiled for them whatever
// -march says, and runs only after the run-time check.
#define SHARDLM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

namespace shardlm::cpu {

namespace {

// Queries and keys per tile, as in the fp32 kernels (attention.cpp).
constexpr int kBlock = 64;
constexpr int kBlockPairs = kBlock / 2;
constexpr int kMaxPairs = kAttentionMaxHeadDim / 2;

// vdpbf16ps reads a 32-bit lane as a pair of bf16 values, the first in the low half,
// and adds both products to the fp32 lane. Operands are laid out as such pairs along
// the dimension the product sums over (the "K" of a GEMM):
//  - A operands as rows of pairs (row r, pair k = elements 2k, 2k+1 of row r): a
//    row-major bf16 tile whose rows run along K is already one.
//  - B operands as K/2 rows of n pairs (pair row k, column n = elements 2k and 2k+1
//    of column n).
inline uint32_t bf16_pair(uint16_t first, uint16_t second) {
  return static_cast<uint32_t>(first) | (static_cast<uint32_t>(second) << 16);
}

// C[MR, 16 NV] (+)= A[MR, kp pairs] B[kp pairs, 16 NV]: kAccumulate adds to C, else C
// is overwritten (the accumulators start at zero: no fill of C and no load of it).
// With kMasked the last vector of each C row is masked by last_mask (neither read nor
// written there); B is read in full vectors (its rows are padded to a multiple of 16
// pairs: what the padding holds only reaches the masked lanes). Masking the B loads
// instead made GCC spill the accumulators. Full-width tiles (kBlock keys, head_dim a
// multiple of 16) take the unmasked form.
template <int MR, int NV, bool kAccumulate, bool kMasked>
SHARDLM_BF16_TARGET inline void dot_kernel(float* c, int64_t ldc, const uint32_t* a, int64_t lda,
                                           const uint32_t* b, int64_t ldb, int kp,
                                           __mmask16 last_mask) {
  // Every caller has kp >= 1. Telling GCC so keeps the accumulators in registers: for
  // the kp = 0 path it otherwise routes them through the stack (32 extra spills per call).
  if (kp < 1) __builtin_unreachable();
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      if (!kAccumulate)
        acc[r][v] = _mm512_setzero_ps();
      else if (kMasked && v == NV - 1)
        acc[r][v] = _mm512_maskz_loadu_ps(last_mask, c + r * ldc + 16 * v);
      else
        acc[r][v] = _mm512_loadu_ps(c + r * ldc + 16 * v);
    }
  for (int k = 0; k < kp; ++k) {
    __m512i bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(b + k * ldb + 16 * v);
    for (int r = 0; r < MR; ++r) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(a[r * lda + k]));
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)av, (__m512bh)bv[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      if (kMasked && v == NV - 1)
        _mm512_mask_storeu_ps(c + r * ldc + 16 * v, last_mask, acc[r][v]);
      else
        _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
    }
}

template <int MR, bool kAccumulate>
SHARDLM_BF16_TARGET void dot_rows(float* c, int64_t ldc, const uint32_t* a, int64_t lda,
                                  const uint32_t* b, int64_t ldb, int n, int kp) {
  for (int col = 0; col < n; col += 64) {
    const int width = std::min(64, n - col);
    if (width == 64) {
      dot_kernel<MR, 4, kAccumulate, false>(c + col, ldc, a, lda, b + col, ldb, kp, 0xffff);
      continue;
    }
    const int vectors = (width + 15) / 16;
    const int tail = width - (vectors - 1) * 16;
    const auto last = static_cast<__mmask16>(tail == 16 ? 0xffffu : (1u << tail) - 1u);
    switch (vectors) {
      case 3: dot_kernel<MR, 3, kAccumulate, true>(c + col, ldc, a, lda, b + col, ldb, kp, last); break;
      case 2: dot_kernel<MR, 2, kAccumulate, true>(c + col, ldc, a, lda, b + col, ldb, kp, last); break;
      default: dot_kernel<MR, 1, kAccumulate, true>(c + col, ldc, a, lda, b + col, ldb, kp, last); break;
    }
  }
}

// Of a tile on the causal diagonal (query block = key block), what a product needs: row
// r (query i0 + r) sees keys [0, r], so a group of rows ending at row e needs the first
// e keys. kKeysAlongN: the product's columns are keys (S = Q K^T, dP = dO V^T): the
// group's columns stop at e rounded up to 16 (the later ones are left unwritten: every
// reader masks them). kKeysAlongK: it sums over keys (P V, dS K), whose masked entries
// are zero: the sum stops at the pair holding key e - 1.
enum class Diagonal { kNo, kKeysAlongN, kKeysAlongK };

// C[m, n] (fp32, row stride ldc) (+)= A[m, kp pairs] B[kp pairs, n]: kAccumulate adds
// to C, else overwrites it. B's row stride ldb is at least n rounded up to 16.
template <bool kAccumulate>
SHARDLM_BF16_TARGET void dot_tile(float* c, int64_t ldc, const uint32_t* a, int64_t lda,
                                  const uint32_t* b, int64_t ldb, int m, int n, int kp,
                                  Diagonal diagonal = Diagonal::kNo) {
  for (int r = 0; r < m; r += 4) {
    const int rows = std::min(4, m - r);
    int group_n = n, group_kp = kp;
    if (diagonal == Diagonal::kKeysAlongN) group_n = std::min(n, (r + rows + 15) / 16 * 16);
    if (diagonal == Diagonal::kKeysAlongK) group_kp = std::min(kp, (r + rows + 1) / 2);
    float* c_rows = c + r * ldc;
    const uint32_t* a_rows = a + r * lda;
    switch (rows) {
      case 4: dot_rows<4, kAccumulate>(c_rows, ldc, a_rows, lda, b, ldb, group_n, group_kp); break;
      case 3: dot_rows<3, kAccumulate>(c_rows, ldc, a_rows, lda, b, ldb, group_n, group_kp); break;
      case 2: dot_rows<2, kAccumulate>(c_rows, ldc, a_rows, lda, b, ldb, group_n, group_kp); break;
      default: dot_rows<1, kAccumulate>(c_rows, ldc, a_rows, lda, b, ldb, group_n, group_kp); break;
    }
  }
}
constexpr bool kAdd = true, kOverwrite = false;

// dst[j] = src[j] rounded to bf16 for j < n, 32 values per vcvtne2ps2bf16: round to
// nearest even like float_to_bf16, except that inputs below the smallest normal float
// flush to zero (probabilities and score gradients that small weigh nothing here).
SHARDLM_BF16_TARGET inline void round_to_bf16(uint16_t* dst, const float* src, int n) {
  int j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + j + 16), _mm512_loadu_ps(src + j));
    _mm512_storeu_si512(dst + j, (__m512i)v);
  }
  for (; j < n; ++j) dst[j] = float_to_bf16(src[j]);
}

// Masks selecting every lane, for the masked forms of intrinsics (unpack, shuffle, max,
// ...): the plain forms trip GCC 12's -Wuninitialized inside its own headers.
constexpr __mmask16 kAll16 = 0xffff;
constexpr __mmask8 kAll8 = 0xff;

// The softmax here runs in base 2: scores scaled by scale * log2(e) (so exp becomes
// 2^y with no reduction by ln 2: 11 vector operations where exp_approx takes 16), the
// running maxima in the same units, lse stored in natural units. Against base e this
// adds one fp32 rounding of the scale (relative 2^-24, i.e. ~1e-6 relative on a
// probability 2^-30 below the row's maximum): fp32 noise next to the bf16 roundings of P.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;

// 2^y on 16 lanes for y <= 0 (clamped below at -126): y = n + f with n an integer and
// f in [-1/2, 1/2], 2^f by its Taylor polynomial of degree 6 (relative error < 9e-8,
// below fp32's half ulp), times 2^n by vscalefps.
SHARDLM_BF16_TARGET inline __m512 exp2_16(__m512 y) {
  y = _mm512_maskz_max_ps(kAll16, y, _mm512_set1_ps(-126.0f));
  const __m512 n =
      _mm512_maskz_roundscale_ps(kAll16, y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);  // exact
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);  // ln2^6 / 6!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kAll16, p, n);
}

SHARDLM_BF16_TARGET inline __m512 max16(__m512 a, __m512 b) { return _mm512_maskz_max_ps(kAll16, a, b); }

// Maximum (kMax) or sum of the 16 lanes, halving the width each time (the library's
// _mm512_reduce_* trip -Wuninitialized).
template <bool kMax>
SHARDLM_BF16_TARGET inline float reduce_across(__m512 v) {
  const __m256 lo8 = _mm512_maskz_extractf32x8_ps(kAll8, v, 0);
  const __m256 hi8 = _mm512_maskz_extractf32x8_ps(kAll8, v, 1);
  const __m256 a = kMax ? _mm256_max_ps(lo8, hi8) : _mm256_add_ps(lo8, hi8);
  const __m128 lo4 = _mm256_castps256_ps128(a), hi4 = _mm256_extractf128_ps(a, 1);
  __m128 b = kMax ? _mm_max_ps(lo4, hi4) : _mm_add_ps(lo4, hi4);
  const __m128 upper2 = _mm_movehl_ps(b, b);
  b = kMax ? _mm_max_ps(b, upper2) : _mm_add_ps(b, upper2);
  const __m128 odd = _mm_movehdup_ps(b);
  return _mm_cvtss_f32(kMax ? _mm_max_ss(b, odd) : _mm_add_ss(b, odd));
}
SHARDLM_BF16_TARGET inline float max_across(__m512 v) { return reduce_across<true>(v); }
SHARDLM_BF16_TARGET inline float sum_across(__m512 v) { return reduce_across<false>(v); }

// Lane masks of the kBlock = 4 x 16 columns of a tile row whose first `valid` are visible.
struct RowMasks {
  __mmask16 m[kBlock / 16];
};
inline RowMasks row_masks(int valid) {
  const uint64_t all = valid >= 64 ? ~0ull : (1ull << valid) - 1;
  return {{static_cast<__mmask16>(all), static_cast<__mmask16>(all >> 16),
           static_cast<__mmask16>(all >> 32), static_cast<__mmask16>(all >> 48)}};
}
static_assert(kBlock == 64, "row_masks and the fused row passes assume 4 vectors per tile row");

// online_softmax_block (fast_math.hpp) for one score row of a tile, in registers and in
// base 2 (scale2 = scale * log2(e); row_max in those units), that writes the
// probabilities rounded to bf16 (p_out[0, kBlock); masked keys 0) instead of fp32 in
// place: one pass over the row instead of max, exp + sum, zero fill and rounding
// passes, with the reductions across lanes done once per row. The sum's order differs
// from the fp32 kernel's (the bf16 results are bound by the roundings, not bits).
SHARDLM_BF16_TARGET inline float softmax_row_to_bf16(uint16_t* p_out, const float* scores,
                                                     int valid, float scale2, float& row_max,
                                                     float& row_sum) {
  const RowMasks mask = row_masks(valid);
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  __m512 x[4];
  for (int v = 0; v < 4; ++v) x[v] = _mm512_mask_loadu_ps(minus_inf, mask.m[v], scores + 16 * v);
  // max_j(s_j * scale2) == max_j(s_j) * scale2 exactly (scale2 > 0, rounding monotone).
  const float block_max =
      max_across(max16(max16(x[0], x[1]), max16(x[2], x[3]))) * scale2;
  const float new_max = std::max(row_max, block_max);
  const __m512 scale_v = _mm512_set1_ps(scale2), max_v = _mm512_set1_ps(new_max);
  __m512 p[4];
  for (int v = 0; v < 4; ++v)
    p[v] = _mm512_maskz_mov_ps(mask.m[v], exp2_16(_mm512_fmsub_ps(x[v], scale_v, max_v)));
  const float block_sum =
      sum_across(_mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3])));
  _mm512_storeu_si512(p_out, (__m512i)_mm512_cvtne2ps_pbh(p[1], p[0]));
  _mm512_storeu_si512(p_out + 32, (__m512i)_mm512_cvtne2ps_pbh(p[3], p[2]));
  const float correction = exp_approx((row_max - new_max) * kLn2);
  row_sum = row_sum * correction + block_sum;
  row_max = new_max;
  return correction;
}

// One query row of a backward tile: p = e^(s scale - lse) = 2^(s scale2 - lse2) (base 2
// as in the forward: scale2 = scale log2(e), lse2 = lse log2(e)), dS = p (dP - D) scale
// for the visible keys (0 for the rest), rounded to bf16 (round_to_bf16's rounding).
struct ProbabilityAndGradient {
  __m256bh p[4], ds[4];
};
SHARDLM_BF16_TARGET inline ProbabilityAndGradient score_gradient_row(const float* scores,
                                                                     const float* dp, int valid,
                                                                     float scale, float scale2,
                                                                     float row_lse2, float d_i) {
  const RowMasks mask = row_masks(valid);
  const __m512 scale_v = _mm512_set1_ps(scale), scale2_v = _mm512_set1_ps(scale2);
  const __m512 lse_v = _mm512_set1_ps(row_lse2);
  const __m512 d_v = _mm512_set1_ps(d_i);
  ProbabilityAndGradient out;
  for (int v = 0; v < 4; ++v) {
    // Masked loads: past the visible keys a diagonal tile's scores are not written.
    const __m512 s = _mm512_maskz_loadu_ps(mask.m[v], scores + 16 * v);
    const __m512 p =
        _mm512_maskz_mov_ps(mask.m[v], exp2_16(_mm512_fmsub_ps(s, scale2_v, lse_v)));
    const __m512 dp_v = _mm512_maskz_loadu_ps(mask.m[v], dp + 16 * v);
    const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(dp_v, d_v)), scale_v);
    out.p[v] = _mm512_cvtneps_pbh(p);
    out.ds[v] = _mm512_cvtneps_pbh(ds);
  }
  return out;
}

// 16 pairs (first[c], second[c]) of bf16 values, as vdpbf16ps reads them.
SHARDLM_BF16_TARGET inline __m512i interleave_pairs(__m256bh first, __m256bh second) {
  return _mm512_or_si512(_mm512_maskz_cvtepu16_epi32(kAll16, (__m256i)first),
                         _mm512_maskz_slli_epi32(
                             kAll16, _mm512_maskz_cvtepu16_epi32(kAll16, (__m256i)second), 16));
}

// Row stride of B operands whose rows are n pairs long: n rounded up to 16.
inline int padded(int n) { return (n + 15) / 16 * 16; }

// (kAll16, kAll8: defined above exp16.)
SHARDLM_BF16_TARGET inline __m512i unpacklo32(__m512i a, __m512i b) {
  return _mm512_maskz_unpacklo_epi32(kAll16, a, b);
}
SHARDLM_BF16_TARGET inline __m512i unpackhi32(__m512i a, __m512i b) {
  return _mm512_maskz_unpackhi_epi32(kAll16, a, b);
}
SHARDLM_BF16_TARGET inline __m512i unpacklo64(__m512i a, __m512i b) {
  return _mm512_maskz_unpacklo_epi64(kAll8, a, b);
}
SHARDLM_BF16_TARGET inline __m512i unpackhi64(__m512i a, __m512i b) {
  return _mm512_maskz_unpackhi_epi64(kAll8, a, b);
}
template <int kImm>
SHARDLM_BF16_TARGET inline __m512i shuffle128(__m512i a, __m512i b) {
  return _mm512_maskz_shuffle_i32x4(kAll16, a, b, kImm);
}

// dst[c][r] = src[r][c] for r, c < 16: a 16 x 16 block of 32-bit values (row strides in
// elements), in registers.
SHARDLM_BF16_TARGET inline void transpose16(uint32_t* dst, int64_t dst_stride, const uint32_t* src,
                                            int64_t src_stride) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * src_stride);
  // Per 128-bit lane L: t[2i] holds (row 2i, row 2i+1) at columns 4L, 4L+1; t[2i+1] at
  // 4L+2, 4L+3. Then r[4i + c] holds rows 4i..4i+3 at column 4L + c.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = unpacklo32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = unpackhi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = unpacklo64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = unpackhi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = unpacklo64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = unpackhi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Column 4L + c gathers lane L of r[c], r[4 + c], r[8 + c], r[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = shuffle128<0x44>(r[c], r[4 + c]);
    const __m512i x1 = shuffle128<0xee>(r[c], r[4 + c]);
    const __m512i y0 = shuffle128<0x44>(r[8 + c], r[12 + c]);
    const __m512i y1 = shuffle128<0xee>(r[8 + c], r[12 + c]);
    _mm512_storeu_si512(dst + c * dst_stride, shuffle128<0x88>(x0, y0));
    _mm512_storeu_si512(dst + (4 + c) * dst_stride, shuffle128<0xdd>(x0, y0));
    _mm512_storeu_si512(dst + (8 + c) * dst_stride, shuffle128<0x88>(x1, y1));
    _mm512_storeu_si512(dst + (12 + c) * dst_stride, shuffle128<0xdd>(x1, y1));
  }
}

// dst[c][r] = src[r][c] for r < rows, c < cols (32-bit values, row strides in
// elements): 16 x 16 blocks in registers, the ragged edges one by one.
SHARDLM_BF16_TARGET void transpose(uint32_t* dst, int64_t dst_stride, const uint32_t* src,
                                   int64_t src_stride, int rows, int cols) {
  const int full_rows = rows / 16 * 16, full_cols = cols / 16 * 16;
  for (int r = 0; r < full_rows; r += 16)
    for (int c = 0; c < full_cols; c += 16)
      transpose16(dst + c * dst_stride + r, dst_stride, src + r * src_stride + c, src_stride);
  for (int r = 0; r < rows; ++r)
    for (int c = r < full_rows ? full_cols : 0; c < cols; ++c)
      dst[c * dst_stride + r] = src[r * src_stride + c];
}

// B operand along hd with the rows as columns: dst[k][j] = pair k of row j (hd / 2 pair
// rows of kBlock columns; columns from `rows` on are zero). A pair is one dword of the
// row, so this is a dword transpose.
SHARDLM_BF16_TARGET void pairs_by_column(uint32_t* dst, const uint16_t* src, int64_t stride,
                                         int rows, int hd) {
  const int pairs = hd / 2;
  transpose(dst, kBlock, reinterpret_cast<const uint32_t*>(src), stride / 2, rows, pairs);
  for (int k = 0; k < pairs; ++k) std::fill(dst + k * kBlock + rows, dst + (k + 1) * kBlock, 0u);
}

// B operand along the rows: dst[k][c] = (src row 2k, src row 2k+1) at column c, for
// ceil(rows / 2) pair rows of `cols` (row stride ld, padding zero); a missing odd row
// is zero.
void pairs_by_row(uint32_t* dst, int ld, const uint16_t* src, int64_t stride, int rows, int cols) {
  for (int k = 0; 2 * k < rows; ++k) {
    const uint16_t* first = src + 2 * k * stride;
    uint32_t* out = dst + k * ld;
    if (2 * k + 1 < rows) {
      const uint16_t* second = first + stride;
#pragma omp simd
      for (int c = 0; c < cols; ++c) out[c] = bf16_pair(first[c], second[c]);
    } else {
#pragma omp simd
      for (int c = 0; c < cols; ++c) out[c] = bf16_pair(first[c], 0);
    }
    std::fill(out + cols, out + ld, 0u);
  }
}

// A operand along the rows, of the transposed block: dst[d][k] = (src row 2k, src row
// 2k+1) at column d: hd rows of kBlockPairs pairs (pairs from ceil(rows / 2) on zero).
// Built as the row pairs (pairs_by_row) transposed in 16 x 16 register blocks: the
// element-by-element gather it replaces cost ~1.5% of the attention time.
SHARDLM_BF16_TARGET void pairs_by_row_transposed(uint32_t* dst, const uint16_t* src,
                                                 int64_t stride, int rows, int hd) {
  const int row_pairs = (rows + 1) / 2;
  alignas(64) uint32_t by_row[kBlockPairs * kAttentionMaxHeadDim];
  pairs_by_row(by_row, hd, src, stride, rows, hd);
  transpose(dst, kBlockPairs, by_row, hd, row_pairs, hd);
  for (int d = 0; d < hd; ++d)
    std::fill(dst + d * kBlockPairs + row_pairs, dst + (d + 1) * kBlockPairs, 0u);
}

inline const uint32_t* as_pairs(const uint16_t* p) { return reinterpret_cast<const uint32_t*>(p); }

// Per-thread scratch for one head's precomputed operands: grows to the largest head
// once, then is reused (no allocation in steady state).
uint32_t* head_scratch(size_t dwords) {
  thread_local TrackedBuffer buffer;
  return static_cast<uint32_t*>(buffer.grow_to(MemCategory::other, dwords * sizeof(uint32_t)));
}

struct Head {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  int64_t stride;      // 3C
  int64_t out_offset;  // row 0, head h in out / dout
  int64_t lse_offset;
  int hd;
};

Head head_of(const uint16_t* qkv, int b, int h, int T, int C, int H) {
  const int hd = C / H;
  const int64_t stride = 3 * static_cast<int64_t>(C);
  const uint16_t* q = qkv + static_cast<int64_t>(b) * T * stride + h * hd;
  return {q, q + C, q + 2 * C, stride, static_cast<int64_t>(b) * T * C + h * hd,
          (static_cast<int64_t>(b) * H + h) * T, hd};
}

// One (batch, head) of the forward. Every key block's operands (K^T pairs for the
// scores, V row pairs for P V) are built once per head, then each query block runs its
// online softmax over the key blocks it sees. Q is read in place (A operands are
// broadcast a pair at a time, so their row stride does not matter).
SHARDLM_BF16_TARGET void forward_head(uint16_t* out, float* lse, const uint16_t* qkv, int b,
                                      int h, int T, int C, int H) {
  const Head hv = head_of(qkv, b, h, T, C, H);
  const int hd = hv.hd;
  const int pairs = hd / 2;
  const int ld = padded(hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float scale2 = scale * kLog2e;  // scores in base-2 units (see exp2_16)
  const int num_blocks = (T + kBlock - 1) / kBlock;
  const size_t k_block_dwords = static_cast<size_t>(pairs) * kBlock;
  const size_t v_block_dwords = static_cast<size_t>(kBlockPairs) * ld;
  uint32_t* k_cols = head_scratch(num_blocks * (k_block_dwords + v_block_dwords));
  uint32_t* v_rows = k_cols + num_blocks * k_block_dwords;
  for (int block = 0; block < num_blocks; ++block) {
    const int j0 = block * kBlock;
    const int nk = std::min(kBlock, T - j0);
    pairs_by_column(k_cols + block * k_block_dwords, hv.k + j0 * hv.stride, hv.stride, nk, hd);
    pairs_by_row(v_rows + block * v_block_dwords, ld, hv.v + j0 * hv.stride, hv.stride, nk, hd);
  }

  alignas(64) float s[kBlock * kBlock];
  alignas(64) uint16_t p_tile[kBlock * kBlock];
  alignas(64) float acc[kBlock * kAttentionMaxHeadDim];
  float row_max[kBlock];
  float row_sum[kBlock];
  for (int i0 = 0; i0 < T; i0 += kBlock) {
    const int nq = std::min(kBlock, T - i0);
    const uint32_t* q = as_pairs(hv.q + i0 * hv.stride);
    std::fill(acc, acc + nq * hd, 0.0f);
    std::fill(row_max, row_max + nq, -INFINITY);
    std::fill(row_sum, row_sum + nq, 0.0f);
    for (int j0 = 0; j0 <= i0; j0 += kBlock) {
      const int block = j0 / kBlock;
      const int nk = std::min(kBlock, T - j0);
      const bool diagonal = j0 == i0;
      dot_tile<kOverwrite>(s, kBlock, q, hv.stride / 2, k_cols + block * k_block_dwords, kBlock,
                           nq, kBlock, pairs, diagonal ? Diagonal::kKeysAlongN : Diagonal::kNo);
      for (int ii = 0; ii < nq; ++ii) {
        const float correction =
            softmax_row_to_bf16(p_tile + ii * kBlock, s + ii * kBlock,
                                visible_keys(i0 + ii, j0, nk), scale2, row_max[ii], row_sum[ii]);
        float* a = acc + ii * hd;
#pragma omp simd
        for (int d = 0; d < hd; ++d) a[d] *= correction;
      }
      // acc += P V over the block's keys (masked probabilities are zero).
      dot_tile<kAdd>(acc, hd, as_pairs(p_tile), kBlockPairs, v_rows + block * v_block_dwords, ld,
                     nq, hd, (nk + 1) / 2, diagonal ? Diagonal::kKeysAlongK : Diagonal::kNo);
    }
    for (int ii = 0; ii < nq; ++ii) {
      const int i = i0 + ii;
      const float inv_sum = 1.0f / row_sum[ii];
      uint16_t* out_row = out + hv.out_offset + static_cast<int64_t>(i) * C;
      const float* a = acc + ii * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) out_row[d] = float_to_bf16(a[d] * inv_sum);
      lse[hv.lse_offset + i] = row_max[ii] * kLn2 + std::log(row_sum[ii]);
    }
  }
}

// One (batch, head) of the backward. Per head: dout rounded to bf16, its and Q's
// transposed row pairs per query block (A operands of dV^T = dO^T P and dK^T = Q^T dS,
// which take P and dS as B operands, interleaved from their rows without a transpose),
// and D_i. Key blocks outer: dK^T and dV^T accumulate in scratch and are written
// (transposed back) once per key block; dQ accumulates in place (fp32).
SHARDLM_BF16_TARGET void backward_head(float* dqkv, const float* dout, const uint16_t* qkv,
                                       const uint16_t* out, const float* lse, int b, int h, int T,
                                       int C, int H) {
  const Head hv = head_of(qkv, b, h, T, C, H);
  const int hd = hv.hd;
  const int pairs = hd / 2;
  const int ld = padded(hd);
  const int64_t stride = hv.stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float scale2 = scale * kLog2e;  // scores in base-2 units (see exp2_16)
  float* dq = dqkv + (hv.q - qkv);
  float* dk = dq + C;
  float* dv = dq + 2 * C;
  const float* head_dout = dout + hv.out_offset;
  const uint16_t* head_out = out + hv.out_offset;
  const float* head_lse = lse + hv.lse_offset;
  const int num_blocks = (T + kBlock - 1) / kBlock;

  // Per head: dout in bf16 [T, hd] (A of dP), dO^T and Q^T pairs [hd, kBlockPairs] per
  // query block, D [T], and dQ accumulated contiguously ([T, hd] fp32; copied into dqkv
  // at the end): in place, its rows at dqkv's stride (3C floats) fall into few L1 sets.
  const size_t transposed_dwords = static_cast<size_t>(hd) * kBlockPairs;
  const size_t dout_dwords = (static_cast<size_t>(T) * hd + 1) / 2;
  const size_t dq_floats = static_cast<size_t>(T) * hd;
  uint32_t* scratch =
      head_scratch(dq_floats + dout_dwords + 2 * num_blocks * transposed_dwords + T);
  auto* dq_rows = reinterpret_cast<float*>(scratch);  // first: 64-byte aligned
  scratch += dq_floats;
  auto* dout16 = reinterpret_cast<uint16_t*>(scratch);
  uint32_t* dout_t = scratch + dout_dwords;
  uint32_t* q_t = dout_t + num_blocks * transposed_dwords;
  auto* D = reinterpret_cast<float*>(q_t + num_blocks * transposed_dwords);
  for (int i = 0; i < T; ++i) {
    const float* g = head_dout + static_cast<int64_t>(i) * C;
    const uint16_t* o = head_out + static_cast<int64_t>(i) * C;
    uint16_t* g16 = dout16 + static_cast<int64_t>(i) * hd;
    // D_i = dout_i . out_i, the softmax Jacobian's row term, on the rounded dout that
    // dP uses (so a row with one visible key gets dS = 0 exactly).
    round_to_bf16(g16, g, hd);
    float d_i = 0.0f;
#pragma omp simd reduction(+ : d_i)
    for (int d = 0; d < hd; ++d) d_i += bf16_to_float(g16[d]) * bf16_to_float(o[d]);
    D[i] = d_i;
  }
  for (int block = 0; block < num_blocks; ++block) {
    const int i0 = block * kBlock;
    const int nq = std::min(kBlock, T - i0);
    pairs_by_row_transposed(dout_t + block * transposed_dwords, dout16 + static_cast<int64_t>(i0) * hd,
                            hd, nq, hd);
    pairs_by_row_transposed(q_t + block * transposed_dwords, hv.q + i0 * stride, stride, nq, hd);
  }

  alignas(64) uint32_t k_cols[kMaxPairs * kBlock];                  // B of S = Q K^T
  alignas(64) uint32_t v_cols[kMaxPairs * kBlock];                  // B of dP = dO V^T
  alignas(64) uint32_t k_rows[kBlockPairs * kAttentionMaxHeadDim];  // B of dQ = dS K
  alignas(64) float dk_t[kAttentionMaxHeadDim * kBlock];            // dK^T of the key block
  alignas(64) float dv_t[kAttentionMaxHeadDim * kBlock];            // dV^T of the key block
  alignas(64) float s[kBlock * kBlock];
  alignas(64) float dp[kBlock * kBlock];
  alignas(64) uint16_t ds_tile[kBlock * kBlock];                    // A of dQ
  alignas(64) uint32_t p_rows[kBlockPairs * kBlock];                // B of dV^T
  alignas(64) uint32_t ds_rows[kBlockPairs * kBlock];               // B of dK^T

  std::fill(dq_rows, dq_rows + dq_floats, 0.0f);

  for (int j0 = 0; j0 < T; j0 += kBlock) {
    const int nk = std::min(kBlock, T - j0);
    pairs_by_column(k_cols, hv.k + j0 * stride, stride, nk, hd);
    pairs_by_column(v_cols, hv.v + j0 * stride, stride, nk, hd);
    pairs_by_row(k_rows, ld, hv.k + j0 * stride, stride, nk, hd);
    std::fill(dk_t, dk_t + hd * kBlock, 0.0f);
    std::fill(dv_t, dv_t + hd * kBlock, 0.0f);
    for (int i0 = j0; i0 < T; i0 += kBlock) {
      const int block = i0 / kBlock;
      const int nq = std::min(kBlock, T - i0);
      const Diagonal keys_along_n = i0 == j0 ? Diagonal::kKeysAlongN : Diagonal::kNo;
      dot_tile<kOverwrite>(s, kBlock, as_pairs(hv.q + i0 * stride), stride / 2, k_cols, kBlock,
                           nq, kBlock, pairs, keys_along_n);
      dot_tile<kOverwrite>(dp, kBlock, as_pairs(dout16 + static_cast<int64_t>(i0) * hd), pairs,
                           v_cols, kBlock, nq, kBlock, pairs, keys_along_n);
      // P and dS rounded to bf16 two query rows at a time: dS as rows (A of dQ), both as
      // row pairs (B of dV^T and dK^T); a missing odd row pairs with zero.
      const int query_pairs = (nq + 1) / 2;
      for (int pair = 0; pair < query_pairs; ++pair) {
        const int ii = 2 * pair, i = i0 + ii;
        const ProbabilityAndGradient first =
            score_gradient_row(s + ii * kBlock, dp + ii * kBlock, visible_keys(i, j0, nk), scale,
                               scale2, head_lse[i] * kLog2e, D[i]);
        ProbabilityAndGradient second{};
        if (ii + 1 < nq)
          second = score_gradient_row(s + (ii + 1) * kBlock, dp + (ii + 1) * kBlock,
                                      visible_keys(i + 1, j0, nk), scale, scale2,
                                      head_lse[i + 1] * kLog2e, D[i + 1]);
        for (int v = 0; v < 4; ++v) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_tile + ii * kBlock + 16 * v),
                              (__m256i)first.ds[v]);
          if (ii + 1 < nq)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_tile + (ii + 1) * kBlock + 16 * v),
                                (__m256i)second.ds[v]);
          _mm512_storeu_si512(p_rows + pair * kBlock + 16 * v,
                              interleave_pairs(first.p[v], second.p[v]));
          _mm512_storeu_si512(ds_rows + pair * kBlock + 16 * v,
                              interleave_pairs(first.ds[v], second.ds[v]));
        }
      }
      // dV^T += dO^T P;  dK^T += Q^T dS;  dQ += dS K.
      dot_tile<kAdd>(dv_t, kBlock, dout_t + block * transposed_dwords, kBlockPairs, p_rows, kBlock, hd,
               kBlock, query_pairs);
      dot_tile<kAdd>(dk_t, kBlock, q_t + block * transposed_dwords, kBlockPairs, ds_rows, kBlock, hd,
               kBlock, query_pairs);
      dot_tile<kAdd>(dq_rows + static_cast<int64_t>(i0) * hd, hd, as_pairs(ds_tile), kBlockPairs,
                     k_rows, ld, nq, hd,
                     (nk + 1) / 2, i0 == j0 ? Diagonal::kKeysAlongK : Diagonal::kNo);
    }
    // dK, dV rows = the accumulated dK^T, dV^T transposed back.
    transpose(reinterpret_cast<uint32_t*>(dk + j0 * stride), stride,
              reinterpret_cast<const uint32_t*>(dk_t), kBlock, hd, nk);
    transpose(reinterpret_cast<uint32_t*>(dv + j0 * stride), stride,
              reinterpret_cast<const uint32_t*>(dv_t), kBlock, hd, nk);
  }
  for (int i = 0; i < T; ++i)
    std::copy(dq_rows + static_cast<int64_t>(i) * hd, dq_rows + static_cast<int64_t>(i + 1) * hd,
              dq + i * stride);
}

}  // namespace

bool bf16_dot_products_available() {
  static const bool available = __builtin_cpu_supports("avx512bf16") != 0;
  return available;
}

void attention_forward_bf16_dot(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T,
                                int C, int H) {
  const int64_t num_tasks = static_cast<int64_t>(B) * H;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task)
    forward_head(out, lse, qkv, static_cast<int>(task / H), static_cast<int>(task % H), T, C, H);
}

void attention_backward_bf16_dot(float* dqkv, const float* dout, const uint16_t* qkv,
                                 const uint16_t* out, const float* lse, int B, int T, int C,
                                 int H) {
  const int64_t num_tasks = static_cast<int64_t>(B) * H;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task)
    backward_head(dqkv, dout, qkv, out, lse, static_cast<int>(task / H),
                  static_cast<int>(task % H), T, C, H);
}

}  // namespace shardlm::cpu
