#include "shardlm/backend/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardlm/backend/cpu/attention_bf16.hpp"
#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

// Tiles of kBlock queries x kBlock keys. Query and key blocks are aligned to the
// same grid, so only diagonal tiles straddle the causal boundary.
constexpr int kBlock = 64;

// 16 floats as one value (GCC/Clang vector extension): one zmm register with
// AVX-512, split by the compiler on narrower machines. Lets the tile products below
// keep a 4 x 64 accumulator block in registers, which plain loops do not get.
using v16 = float __attribute__((vector_size(64)));
constexpr int kLanes = 16;

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

// C[MR x 16*NV] += A[MR x k] B[k x 16*NV], with A(r, kk) = a[r * a_rs + kk * a_cs]
// (so A may be read transposed) and B's rows contiguous at stride ldb.
template <int MR, int NV>
inline void tile_kernel(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                        const float* b, int64_t ldb, int k) {
  // Every caller has k >= 1. Telling GCC so keeps the accumulators in registers: for
  // the k = 0 path it otherwise routes them through the stack around the loop.
  if (k < 1) __builtin_unreachable();
  v16 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = load16(c + r * ldc + v * kLanes);
  for (int kk = 0; kk < k; ++kk) {
    v16 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load16(b + kk * ldb + v * kLanes);
    for (int r = 0; r < MR; ++r) {
      const float av = a[r * a_rs + kk * a_cs];
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) store16(c + r * ldc + v * kLanes, acc[r][v]);
}

template <int MR>
inline void tile_row_block(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs,
                           const float* b, int64_t ldb, int n, int k) {
  int col = 0;
  for (; col + 4 * kLanes <= n; col += 4 * kLanes)
    tile_kernel<MR, 4>(c + col, ldc, a, a_rs, a_cs, b + col, ldb, k);
  switch ((n - col) / kLanes) {
    case 3: tile_kernel<MR, 3>(c + col, ldc, a, a_rs, a_cs, b + col, ldb, k); break;
    case 2: tile_kernel<MR, 2>(c + col, ldc, a, a_rs, a_cs, b + col, ldb, k); break;
    case 1: tile_kernel<MR, 1>(c + col, ldc, a, a_rs, a_cs, b + col, ldb, k); break;
    default: break;
  }
  col += (n - col) / kLanes * kLanes;
  // Columns beyond a multiple of 16 (head_dim 8, 24, ...): plain loops.
  for (int r = 0; r < MR; ++r)
    for (int kk = 0; kk < k; ++kk) {
      const float av = a[r * a_rs + kk * a_cs];
      for (int j = col; j < n; ++j) c[r * ldc + j] += av * b[kk * ldb + j];
    }
}

// C[m x n] += A[m x k] B[k x n] for the small tiles of attention (A as above). With
// causal_columns (a score tile on the causal diagonal: row r is query i0 + r, column j
// key i0 + j) each group of rows stops at the first column block of 16 past its last
// row's key: the later columns are masked for every row of the group, so they keep
// what C held (no reader uses them).
void tile_gemm(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
               int64_t ldb, int m, int n, int k, bool causal_columns = false) {
  // Six rows at a time: 24 accumulators + 4 B vectors + a broadcast fit the 32 zmm
  // registers (~15% faster than four rows on 64 x 64 x 64 tiles). Each element's sum
  // runs over k in order whatever the blocking, so the results do not depend on it.
  for (int r = 0; r < m; r += 6) {
    const int rows = std::min(6, m - r);
    const int cols = causal_columns ? std::min(n, (r + rows + kLanes - 1) / kLanes * kLanes) : n;
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
void transpose_block(float* dst, const typename S::Elem* src, int64_t src_stride, int rows,
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
const float* load_tile(float* tile, const typename S::Elem* src, int64_t stride, int rows, int hd) {
  for (int r = 0; r < rows; ++r) {
    const typename S::Elem* in = src + r * stride;
    float* dst = tile + r * hd;
#pragma omp simd
    for (int d = 0; d < hd; ++d) dst[d] = S::widen(in[d]);
  }
  return tile;
}

void check_shape(int T, int C, int H) {
  SHARDLM_CHECK(H > 0 && C % H == 0, "attention: n_embd {} is not divisible by n_head {}", C, H);
  SHARDLM_CHECK(C / H <= kAttentionMaxHeadDim, "attention: head_dim {} exceeds the supported {}",
                C / H, kAttentionMaxHeadDim);
  SHARDLM_CHECK(T > 0, "attention: sequence length must be positive, got {}", T);
}

// Where one (batch, head) lives in the qkv / out / lse tensors.
template <typename S>
struct HeadView {
  const typename S::Elem* q;
  const typename S::Elem* k;
  const typename S::Elem* v;
  int64_t qkv_stride;  // 3C
  int64_t out_offset;  // of row 0, head h in out / dout
  int64_t lse_offset;
  int hd;
};

template <typename S>
HeadView<S> head_view(const typename S::Elem* qkv, int b, int h, int T, int C, int H) {
  const int hd = C / H;
  const int64_t stride = 3 * static_cast<int64_t>(C);
  const typename S::Elem* q = qkv + static_cast<int64_t>(b) * T * stride + h * hd;
  return {q,
          q + C,
          q + 2 * C,
          stride,
          static_cast<int64_t>(b) * T * C + h * hd,
          (static_cast<int64_t>(b) * H + h) * T,
          hd};
}

// Scores of a tile: s[ii][j] = q_ii . k_j for the nq rows of the query tile q ([nq, hd]),
// all kBlock columns of the transposed key block k_t (on the causal diagonal, the
// columns tile_gemm's causal_columns skips are left zero).
void tile_scores(float* s, const float* q, const float* k_t, int nq, int hd, bool diagonal) {
  std::fill(s, s + nq * kBlock, 0.0f);
  tile_gemm(s, kBlock, q, hd, 1, k_t, kBlock, nq, kBlock, hd, diagonal);
}


// Per-thread scratch for one head's operands in fp32 (contiguous rows, transposed key
// blocks): grows to the largest head once, then is reused (no allocation in steady state).
float* head_scratch(size_t floats) {
  thread_local TrackedBuffer buffer;
  return static_cast<float*>(buffer.grow_to(MemCategory::other, floats * sizeof(float)));
}

// One (batch, head, query block) of the forward, with an online softmax over key blocks.
// q_all and v_all are the head's q and v rows in fp32 ([T, hd]), k_t_all its key blocks
// transposed ([T / kBlock][hd][kBlock]), all built once per head (forward_head).
template <typename S>
void forward_query_block(typename S::Elem* out, float* lse, const HeadView<S>& hv,
                         const float* q_all, const float* k_t_all, const float* v_all, int i0,
                         int T, int C) {
  const int hd = hv.hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int nq = std::min(kBlock, T - i0);

  alignas(64) float s[kBlock * kBlock];
  alignas(64) float acc[kBlock * kAttentionMaxHeadDim];
  float row_max[kBlock];
  float row_sum[kBlock];
  std::fill(acc, acc + nq * hd, 0.0f);
  std::fill(row_max, row_max + nq, -INFINITY);
  std::fill(row_sum, row_sum + nq, 0.0f);

  const float* q = q_all + static_cast<int64_t>(i0) * hd;
  for (int j0 = 0; j0 <= i0; j0 += kBlock) {
    const int nk = std::min(kBlock, T - j0);
    const float* k_t = k_t_all + static_cast<int64_t>(j0 / kBlock) * hd * kBlock;
    tile_scores(s, q, k_t, nq, hd, j0 == i0);
    for (int ii = 0; ii < nq; ++ii) {
      float* p = s + ii * kBlock;
      const float correction = online_softmax_block(p, visible_keys(i0 + ii, j0, nk), kBlock,
                                                    scale, row_max[ii], row_sum[ii]);
      float* a = acc + ii * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) a[d] *= correction;
    }
    // acc += P V over the block's keys (masked probabilities are zero).
    const float* v = v_all + static_cast<int64_t>(j0) * hd;
    tile_gemm(acc, hd, s, kBlock, 1, v, hd, nq, hd, nk);
  }
  for (int ii = 0; ii < nq; ++ii) {
    const int i = i0 + ii;
    const float inv_sum = 1.0f / row_sum[ii];
    typename S::Elem* out_row = out + hv.out_offset + static_cast<int64_t>(i) * C;
    const float* a = acc + ii * hd;
#pragma omp simd
    for (int d = 0; d < hd; ++d) out_row[d] = S::narrow(a[d] * inv_sum);
    lse[hv.lse_offset + i] = row_max[ii] + std::log(row_sum[ii]);
  }
}

// One (batch, head) of the forward: its q and v rows (widened) and transposed key blocks
// are built once, where building them per (query block, key block) tile cost ~20%.
template <typename S>
void forward_head(typename S::Elem* out, float* lse, const typename S::Elem* qkv, int b, int h,
                  int T, int C, int H) {
  const HeadView<S> hv = head_view<S>(qkv, b, h, T, C, H);
  const int hd = hv.hd;
  const int num_blocks = (T + kBlock - 1) / kBlock;
  const int64_t rows = static_cast<int64_t>(T) * hd;
  float* q_all = head_scratch(2 * rows + static_cast<int64_t>(num_blocks) * hd * kBlock);
  float* v_all = q_all + rows;
  float* k_t_all = v_all + rows;
  load_tile<S>(q_all, hv.q, hv.qkv_stride, T, hd);
  load_tile<S>(v_all, hv.v, hv.qkv_stride, T, hd);
  for (int block = 0; block < num_blocks; ++block) {
    const int j0 = block * kBlock;
    transpose_block<S>(k_t_all + static_cast<int64_t>(block) * hd * kBlock,
                       hv.k + j0 * hv.qkv_stride, hv.qkv_stride, std::min(kBlock, T - j0), hd);
  }
  for (int i0 = 0; i0 < T; i0 += kBlock)
    forward_query_block<S>(out, lse, hv, q_all, k_t_all, v_all, i0, T, C);
}

// One (batch, head) of the backward. Key blocks outer: a block's dk and dv
// accumulate in scratch over the query blocks that see it and are written once; dq
// accumulates in place. Probabilities are recomputed from the saved log-sum-exp.
template <typename S>
void backward_head(float* dqkv, const float* dout, const typename S::Elem* qkv,
                   const typename S::Elem* out, const float* lse, int b, int h, int T, int C,
                   int H) {
  const HeadView<S> hv = head_view<S>(qkv, b, h, T, C, H);
  const int hd = hv.hd;
  const int64_t stride = hv.qkv_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* dq = dqkv + (hv.q - qkv);
  float* dk = dq + C;
  float* dv = dq + 2 * C;
  const float* head_dout = dout + hv.out_offset;
  const typename S::Elem* head_out = out + hv.out_offset;
  const float* head_lse = lse + hv.lse_offset;

  alignas(64) float k_t[kAttentionMaxHeadDim * kBlock];
  alignas(64) float v_t[kAttentionMaxHeadDim * kBlock];
  alignas(64) float p[kBlock * kBlock];
  alignas(64) float ds[kBlock * kBlock];
  alignas(64) float dk_acc[kBlock * kAttentionMaxHeadDim];
  alignas(64) float dv_acc[kBlock * kAttentionMaxHeadDim];
  alignas(64) float k_tile[kBlock * kAttentionMaxHeadDim];
  alignas(64) float out_row[kAttentionMaxHeadDim];

  // Per head, once: q and dout rows in fp32 ([T, hd]), a contiguous dq accumulator
  // ([T, hd], copied into dqkv at the end: in place, dq's rows at dqkv's 3C-float stride
  // fall into few L1 sets) and D_i = dout_i . out_i, the
  // softmax Jacobian's row term (sum_j p_ij (dout_i . v_j), without the full row of
  // probabilities). out_row is an fp32 copy, so the reduction vectorizes, and sums, the
  // same way for every storage type.
  const int64_t rows = static_cast<int64_t>(T) * hd;
  float* q_all = head_scratch(3 * rows + T);
  float* dout_all = q_all + rows;
  float* dq_rows = dout_all + rows;
  float* D = dq_rows + rows;
  load_tile<S>(q_all, hv.q, stride, T, hd);
  load_tile<Fp32Storage>(dout_all, head_dout, C, T, hd);
  for (int i = 0; i < T; ++i) {
    const float* dout_row = dout_all + static_cast<int64_t>(i) * hd;
    load_tile<S>(out_row, head_out + static_cast<int64_t>(i) * C, C, 1, hd);
    float d_i = 0.0f;
#pragma omp simd reduction(+ : d_i)
    for (int d = 0; d < hd; ++d) d_i += dout_row[d] * out_row[d];
    D[i] = d_i;
  }

  std::fill(dq_rows, dq_rows + rows, 0.0f);

  for (int j0 = 0; j0 < T; j0 += kBlock) {
    const int nk = std::min(kBlock, T - j0);
    transpose_block<S>(k_t, hv.k + j0 * stride, stride, nk, hd);
    transpose_block<S>(v_t, hv.v + j0 * stride, stride, nk, hd);
    const float* k = load_tile<S>(k_tile, hv.k + j0 * stride, stride, nk, hd);
    std::fill(dk_acc, dk_acc + nk * hd, 0.0f);
    std::fill(dv_acc, dv_acc + nk * hd, 0.0f);
    for (int i0 = j0; i0 < T; i0 += kBlock) {
      const int nq = std::min(kBlock, T - i0);
      const float* dout_rows = dout_all + static_cast<int64_t>(i0) * hd;
      const float* q = q_all + static_cast<int64_t>(i0) * hd;
      tile_scores(p, q, k_t, nq, hd, i0 == j0);
      // dP = dO V^T
      std::fill(ds, ds + nq * kBlock, 0.0f);
      tile_gemm(ds, kBlock, dout_rows, hd, 1, v_t, kBlock, nq, kBlock, hd, i0 == j0);
      for (int ii = 0; ii < nq; ++ii) {
        const int i = i0 + ii;
        const int valid = visible_keys(i, j0, nk);
        const float d_i = D[i];
        const float row_lse = head_lse[i];
        float* p_row = p + ii * kBlock;
        float* ds_row = ds + ii * kBlock;
#pragma omp simd
        for (int j = 0; j < valid; ++j) {
          const float pj = exp_approx(p_row[j] * scale - row_lse);
          p_row[j] = pj;
          ds_row[j] = pj * (ds_row[j] - d_i) * scale;  // dS, with the scores' 1/sqrt(hd)
        }
        std::fill(p_row + valid, p_row + kBlock, 0.0f);
        std::fill(ds_row + valid, ds_row + kBlock, 0.0f);
      }
      // dV += P^T dO;  dK += dS^T Q;  dQ += dS K.
      tile_gemm(dv_acc, hd, p, 1, kBlock, dout_rows, hd, nk, hd, nq);
      tile_gemm(dk_acc, hd, ds, 1, kBlock, q, hd, nk, hd, nq);
      tile_gemm(dq_rows + static_cast<int64_t>(i0) * hd, hd, ds, kBlock, 1, k, hd, nq, hd, nk);
    }
    for (int j = 0; j < nk; ++j) {
      std::copy(dk_acc + j * hd, dk_acc + (j + 1) * hd, dk + (j0 + j) * stride);
      std::copy(dv_acc + j * hd, dv_acc + (j + 1) * hd, dv + (j0 + j) * stride);
    }
  }
  for (int i = 0; i < T; ++i)
    std::copy(dq_rows + static_cast<int64_t>(i) * hd, dq_rows + static_cast<int64_t>(i + 1) * hd,
              dq + i * stride);
}

template <typename S>
void forward_all(typename S::Elem* out, float* lse, const typename S::Elem* qkv, int B, int T,
                 int C, int H) {
  const int64_t num_tasks = static_cast<int64_t>(B) * H;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task)
    forward_head<S>(out, lse, qkv, static_cast<int>(task / H), static_cast<int>(task % H), T, C, H);
}

template <typename S>
void backward_all(float* dqkv, const float* dout, const typename S::Elem* qkv,
                  const typename S::Elem* out, const float* lse, int B, int T, int C, int H) {
  const int64_t num_tasks = static_cast<int64_t>(B) * H;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task)
    backward_head<S>(dqkv, dout, qkv, out, lse, static_cast<int>(task / H),
                     static_cast<int>(task % H), T, C, H);
}

// Calls f with the storage type of `dtype` (a value of that type; only its type matters).
template <typename F>
void with_storage(DType dtype, F&& f) {
  switch (dtype) {
    case DType::fp32: f(Fp32Storage{}); return;
    case DType::bf16: f(Bf16Storage{}); return;
    case DType::fp16: f(Fp16Storage{}); return;
  }
}

}  // namespace

bool attention_uses_bf16_dot_products(int head_dim) {
  return head_dim % 2 == 0 && bf16_dot_products_available();
}

namespace {

// Whether a bf16 attention call takes the dot-product kernels (attention_bf16.hpp).
bool use_bf16_dot_products(Bf16AttentionPath path, DType dtype, int C, int H) {
  if (dtype != DType::bf16 || path == Bf16AttentionPath::kWidenToFp32) return false;
  const bool available = attention_uses_bf16_dot_products(C / H);
  SHARDLM_CHECK(available || path == Bf16AttentionPath::kAuto,
                "attention: bf16 dot products need avx512_bf16 and an even head_dim (got {})",
                C / H);
  return available;
}

}  // namespace

void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, int B, int T, int C, int H) {
  attention_forward_on(Bf16AttentionPath::kAuto, out, lse, qkv, B, T, C, H);
}

void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                        const float* lse, int B, int T, int C, int H) {
  attention_backward_on(Bf16AttentionPath::kAuto, dqkv, dout, qkv, out, lse, B, T, C, H);
}

void attention_forward_on(Bf16AttentionPath path, TypedPtr out, float* lse, ConstTypedPtr qkv,
                          int B, int T, int C, int H) {
  const PhaseScope phase(Phase::attention);
  check_shape(T, C, H);
  SHARDLM_CHECK(out.dtype == qkv.dtype, "attention: output is {} but qkv is {}; expected one type",
                dtype_name(out.dtype), dtype_name(qkv.dtype));
  if (use_bf16_dot_products(path, qkv.dtype, C, H)) {
    attention_forward_bf16_dot(static_cast<uint16_t*>(out.data), lse,
                               static_cast<const uint16_t*>(qkv.data), B, T, C, H);
    return;
  }
  with_storage(qkv.dtype, [&](auto storage) {
    using S = decltype(storage);
    forward_all<S>(static_cast<typename S::Elem*>(out.data), lse,
                   static_cast<const typename S::Elem*>(qkv.data), B, T, C, H);
  });
}

void attention_backward_on(Bf16AttentionPath path, float* dqkv, const float* dout,
                           ConstTypedPtr qkv, ConstTypedPtr out, const float* lse, int B, int T,
                           int C, int H) {
  const PhaseScope phase(Phase::attention);
  check_shape(T, C, H);
  SHARDLM_CHECK(out.dtype == qkv.dtype, "attention: output is {} but qkv is {}; expected one type",
                dtype_name(out.dtype), dtype_name(qkv.dtype));
  if (use_bf16_dot_products(path, qkv.dtype, C, H)) {
    attention_backward_bf16_dot(dqkv, dout, static_cast<const uint16_t*>(qkv.data),
                                static_cast<const uint16_t*>(out.data), lse, B, T, C, H);
    return;
  }
  with_storage(qkv.dtype, [&](auto storage) {
    using S = decltype(storage);
    backward_all<S>(dqkv, dout, static_cast<const typename S::Elem*>(qkv.data),
                    static_cast<const typename S::Elem*>(out.data), lse, B, T, C, H);
  });
}

}  // namespace shardlm::cpu
