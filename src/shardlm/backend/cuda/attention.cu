// Flash-attention-2 style causal attention (forward and a deterministic backward) on
// CUDA cores in fp32: no [B, H, T, T] tensor, an online softmax over key tiles in the
// forward, probabilities recomputed from the saved log-sum-exp in the backward.
//
// Why CUDA cores and not tensor cores: this was written without a GPU to run it on,
// so it is the simplest layout that is correct by construction (and checked as host
// fibers by tests/unit/test_cuda_kernels_emulated.cpp); WMMA/mma tiles are the next
// step once it is measured against the CPU reference on a card.
//
// Layout of a block (every kernel): kThreads = 128 threads; the padded head dimension
// HD (64 for hd <= 64, 128 for hd <= 128; the padding is zeros, which add nothing to a
// dot product) is split over kThreadsPerRow = HD / 32 adjacent threads, so each thread
// holds 32 dimensions of a row in registers: d = part + kThreadsPerRow * k, k < 32
// (interleaved, so the threads of a row read consecutive shared-memory banks). A block
// owns kRows = 128 / kThreadsPerRow rows (64 for HD 64, 32 for HD 128), and the other
// side's tiles are kRows x HD fp32 in shared memory: two of them are 32 KiB for either
// HD, under the 48 KiB of static shared memory. A row's dot products are the threads'
// partial sums combined by xor-shuffles, which give every thread of the row the same
// bits, so the row's branches never diverge. ptxas (CUDA 13, sm_80 and sm_90): forward
// 168 (HD 64) / 128 (HD 128) registers, dQ 164-188, dK dV 243-255, no spills; so 2-4
// blocks (8-16 warps) per SM by registers.
//
// Kernels:
//  - forward: a block per (query tile, query head, batch row); key tiles from the
//    first one any of its queries sees to the diagonal; online softmax per row.
//  - forward over a KV cache: a block per (tile of the new queries, query head); the
//    same key tiles and the same per-tile step (online_softmax_tile) as the forward.
//    Not tuned: a one-token step fills one row of a block (the decode case wants a
//    block per head splitting the keys, once it can be measured on a card).
//  - backward dQ: a block per (query tile, query head, batch row), looping over the
//    same key tiles: dQ_i = sum_j dS_ij k_j, with dS_ij = P_ij (dO_i . v_j - D_i) scale.
//  - backward dK, dV: a block per (key tile, query head, batch row), looping over the
//    query tiles from the diagonal on: dV_j = sum_i P_ij dO_i, dK_j = sum_i dS_ij q_i,
//    accumulated in registers. Multi-head attention writes them in place; GQA writes
//    each query head's into a slot ([2][B T][n_head hd] scratch) and a last kernel adds
//    a kv head's slots in head order (the CPU kernel's sum). A block per query head
//    rather than per kv head: qwen2.5-0.5b (2 kv heads of 7 query heads, T 1024, B 8)
//    gets 1792 blocks instead of 256 on the 132 SMs of an H100/H200.
//  D_i = dO_i . O_i is recomputed where it is needed (the same code in both backward
//  kernels, so the same bits): no scratch buffer, and the cost is 1/kRows of a tile's.
// No atomics anywhere: every sum runs in a fixed order, so the results are the same
// from run to run.
//
// key_begin: the CPU rejects values outside [0, t]; a kernel cannot throw, so values
// outside are clamped into [0, t] (no out-of-range reads, no error either: a caller
// that wants the CPU's error checks key_begin on the host).
#include "shardlm/backend/cuda/attention.cuh"

#include <cmath>
#include <string>
#include <type_traits>

#include <cuda_fp16.h>

#include "shardlm/backend/cuda/kernel_launch.hpp"

namespace shardlm::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kDimsPerThread = 32;

template <int HD>
struct TileShape {
  static_assert(HD == 64 || HD == 128, "head_dim buckets are 64 and 128");
  static constexpr int kThreadsPerRow = HD / kDimsPerThread;  // 2 or 4
  static constexpr int kRows = kThreads / kThreadsPerRow;      // 64 or 32
};

// AttentionShape's helpers are host functions; the kernels use these.
__device__ __forceinline__ int64_t qkv_columns(const AttentionShape& s) {
  return static_cast<int64_t>(s.n_head + 2 * s.n_kv_head) * s.head_dim;
}
__device__ __forceinline__ int64_t out_columns(const AttentionShape& s) {
  return static_cast<int64_t>(s.n_head) * s.head_dim;
}

// How qkv and out are stored: widened to fp32 when loaded (exact), rounded once
// (to nearest, ties to even, as the CPU's conversions) when stored.
struct Fp32Storage {
  using Elem = float;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
struct Bf16Storage {
  using Elem = uint16_t;
  static __device__ __forceinline__ float load(uint16_t v) {
    return __uint_as_float(static_cast<uint32_t>(v) << 16);
  }
  // shardlm::float_to_bf16's integer rounding (a quiet NaN stays NaN).
  static __device__ __forceinline__ uint16_t store(float v) {
    uint32_t bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
  }
};
struct Fp16Storage {
  using Elem = uint16_t;
  static __device__ __forceinline__ float load(uint16_t v) {
    return __half2float(__ushort_as_half(v));
  }
  static __device__ __forceinline__ uint16_t store(float v) {
    return __half_as_ushort(__float2half_rn(v));
  }
};

// The sum of x over the kThreadsPerRow adjacent threads of a row, on each of them
// (a + b == b + a in floating point, so every thread gets the same bits). Every
// thread of the warp must call it (full mask).
template <int kThreadsPerRow>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int offset = 1; offset < kThreadsPerRow; offset <<= 1)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// The first key query t of batch row b sees: key_begin clamped into [0, t].
__device__ __forceinline__ int first_key_of(const int32_t* key_begin, int b, int T, int t) {
  if (key_begin == nullptr) return 0;
  const int begin = key_begin[static_cast<int64_t>(b) * T + t];
  return begin < 0 ? 0 : (begin > t ? t : begin);
}

// Rows [row0, row0 + kRows) of one head ([T, hd] at row stride `stride`) into a
// [kRows][HD] fp32 tile: zeros past T and past hd. Every thread calls it.
template <int HD, typename S>
__device__ __forceinline__ void load_tile(float (*tile)[HD], const typename S::Elem* head,
                                          int64_t stride, int row0, int T, int hd) {
  constexpr int kRows = TileShape<HD>::kRows;
  for (int index = threadIdx.x; index < kRows * HD; index += kThreads) {
    const int r = index / HD, d = index % HD;
    const int row = row0 + r;
    tile[r][d] = (row < T && d < hd) ? S::load(head[static_cast<int64_t>(row) * stride + d]) : 0.0f;
  }
}

// This thread's 32 dimensions of a row of one head (zeros past hd, and for an invalid row).
template <int HD, typename S>
__device__ __forceinline__ void load_row(float (&values)[kDimsPerThread],
                                         const typename S::Elem* row, bool valid, int part,
                                         int hd) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = part + kThreadsPerRow * k;
    values[k] = (valid && d < hd) ? S::load(row[d]) : 0.0f;
  }
}

// This thread's part of dO_i . O_i (the softmax Jacobian's row term D_i), in k order;
// row_sum of it is D_i. Both backward kernels compute D this way, so they agree bitwise.
template <int HD, typename S>
__device__ __forceinline__ float partial_dout_dot_out(const float* dout_row,
                                                      const typename S::Elem* out_row,
                                                      bool valid, int part, int hd) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
  float partial = 0.0f;
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = part + kThreadsPerRow * k;
    if (valid && d < hd) partial = fmaf(dout_row[d], S::load(out_row[d]), partial);
  }
  return partial;
}

// Where one (batch row, query head) lives: the q, k, v columns of its rows in qkv.
template <typename S>
struct HeadColumns {
  const typename S::Elem* q;  // row 0 of the batch row, the query head's columns
  const typename S::Elem* k;  // its kv head's
  const typename S::Elem* v;
};

template <typename S>
__device__ __forceinline__ HeadColumns<S> head_columns(const typename S::Elem* qkv,
                                                       const AttentionShape& s, int b, int h,
                                                       int kv) {
  const int64_t stride = qkv_columns(s);
  const typename S::Elem* row0 = qkv + static_cast<int64_t>(b) * s.T * stride;
  return {row0 + static_cast<int64_t>(h) * s.head_dim,
          row0 + static_cast<int64_t>(s.n_head + kv) * s.head_dim,
          row0 + static_cast<int64_t>(s.n_head + s.n_kv_head + kv) * s.head_dim};
}

// The smallest of the kRows values of `first_keys` (every thread calls it after a
// barrier that follows the writes; it reads shared memory only).
template <int kRows>
__device__ __forceinline__ int tile_min(const int* first_keys) {
  int smallest = first_keys[0];
  for (int r = 1; r < kRows; ++r) smallest = min(smallest, first_keys[r]);
  return smallest;
}

// One key tile of the forward's online softmax for one query row (position i, first
// visible key first_key): the scaled scores of the tile's visible keys (-inf for the
// others), then the running max, total and the accumulated values updated. A row that
// sees none of the tile's keys keeps its state. Every thread of the row calls it (the
// dot products' shuffles); the training forward and the KV cache's step share it, so a
// position gets the same bits from both.
template <int HD>
__device__ __forceinline__ void online_softmax_tile(const float (&q)[kDimsPerThread],
                                                    const float (*k_tile)[HD], const float (*v_tile)[HD],
                                                    int j0, int first_key, int i, float scale, int part,
                                                    float& row_max, float& row_total,
                                                    float (&acc)[kDimsPerThread]) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
  constexpr int kRows = TileShape<HD>::kRows;
  // Scaled scores of this row's visible keys; -inf for the others.
  float scores[kRows];
  float tile_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    float partial = 0.0f;
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k)
      partial = fmaf(q[k], k_tile[j][part + kThreadsPerRow * k], partial);
    const float dot = row_sum<kThreadsPerRow>(partial);
    const int key = j0 + j;
    scores[j] = (key >= first_key && key <= i) ? dot * scale : -INFINITY;
    tile_max = fmaxf(tile_max, scores[j]);
  }
  // A row that sees none of the tile's keys keeps its state (its first visible tile
  // may come later). Uniform over the row's threads.
  if (tile_max != -INFINITY) {
    const float new_max = fmaxf(row_max, tile_max);
    const float correction = expf(row_max - new_max);  // 0 on the row's first tile
    float tile_total = 0.0f;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      scores[j] = expf(scores[j] - new_max);  // masked: e^-inf = 0
      tile_total += scores[j];
    }
    row_total = row_total * correction + tile_total;
    row_max = new_max;
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) acc[k] *= correction;
#pragma unroll
    for (int j = 0; j < kRows; ++j)
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k)
        acc[k] = fmaf(scores[j], v_tile[j][part + kThreadsPerRow * k], acc[k]);
  }
}

// A query row's output: the accumulated values over the softmax total, rounded once
// into the storage type. Every valid row saw its own key, so row_total >= 1.
template <int HD, typename S>
__device__ __forceinline__ void store_out_row(typename S::Elem* out_row, const float (&acc)[kDimsPerThread],
                                              float row_total, int part, int hd) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
  const float inv_total = 1.0f / row_total;
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = part + kThreadsPerRow * k;
    if (d < hd) out_row[d] = S::store(acc[k] * inv_total);
  }
}

// grid (query tiles, n_head, B), kThreads threads.
template <int HD, typename S>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(typename S::Elem* out, float* lse, const typename S::Elem* qkv,
                             AttentionShape s, const int32_t* key_begin, float scale) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
  constexpr int kRows = TileShape<HD>::kRows;
  __shared__ float k_tile[kRows][HD];
  __shared__ float v_tile[kRows][HD];
  __shared__ int first_keys[kRows];

  const int T = s.T, hd = s.head_dim;
  const int i0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;
  const int kv = h / (s.n_head / s.n_kv_head);
  const int64_t stride = qkv_columns(s);
  const HeadColumns<S> head = head_columns<S>(qkv, s, b, h, kv);

  const int row = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  const int i = i0 + row;
  const bool valid = i < T;
  // A row past T sees no key (first key T > every key < T); it still runs every loop
  // so the block's barriers and shuffles stay uniform, and stores nothing.
  const int first_key = valid ? first_key_of(key_begin, b, T, i) : T;

  float q[kDimsPerThread];
  load_row<HD, S>(q, head.q + static_cast<int64_t>(i) * stride, valid, part, hd);
  float acc[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) acc[k] = 0.0f;
  float row_max = -INFINITY, row_total = 0.0f;

  if (part == 0) first_keys[row] = first_key;
  __syncthreads();
  // Key tiles on the query tiles' grid: from the first one a query of the block sees
  // (row i0 is valid, so the minimum is <= i0) to the diagonal. Each of them has a key
  // some row sees (the row with the smallest first key sees it up to its diagonal).
  const int last_row = min(i0 + kRows, T) - 1;
  for (int j0 = tile_min<kRows>(first_keys) / kRows * kRows; j0 <= last_row; j0 += kRows) {
    load_tile<HD, S>(k_tile, head.k, stride, j0, T, hd);
    load_tile<HD, S>(v_tile, head.v, stride, j0, T, hd);
    __syncthreads();

    online_softmax_tile<HD>(q, k_tile, v_tile, j0, first_key, i, scale, part, row_max, row_total, acc);
    __syncthreads();  // the tiles are overwritten next
  }

  if (!valid) return;
  store_out_row<HD, S>(out + (static_cast<int64_t>(b) * T + i) * out_columns(s) + static_cast<int64_t>(h) * hd,
                       acc, row_total, part, hd);
  if (part == 0) lse[(static_cast<int64_t>(b) * s.n_head + h) * T + i] = row_max + logf(row_total);
}

// A KV cache's step (attention_forward_cached): the s.T new queries of one sequence at
// positions [past, past + s.T) over the cache's keys and values of positions [0, past +
// s.T). grid (tiles of the new rows, n_head), kThreads threads. The key tiles lie on the
// training forward's grid (from key 0, kRows apart) and each goes through the same
// online_softmax_tile, so a position gets the bits attention_forward gives it over the
// whole sequence (the query tiles may differ: a row's result depends on its key tiles
// only). No log-sum-exp: nothing runs backward through a cache.
template <int HD, typename S>
__global__ void __launch_bounds__(kThreads)
    attention_forward_cached_kernel(typename S::Elem* out, const typename S::Elem* q_rows, int64_t ld_q,
                                    const typename S::Elem* k_rows, const typename S::Elem* v_rows,
                                    int64_t ld_kv, AttentionShape s, int past, float scale) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
  constexpr int kRows = TileShape<HD>::kRows;
  __shared__ float k_tile[kRows][HD];
  __shared__ float v_tile[kRows][HD];

  const int keys = past + s.T, hd = s.head_dim;
  const int r0 = blockIdx.x * kRows, h = blockIdx.y;
  const int kv = h / (s.n_head / s.n_kv_head);
  const typename S::Elem* head_k = k_rows + static_cast<int64_t>(kv) * hd;
  const typename S::Elem* head_v = v_rows + static_cast<int64_t>(kv) * hd;

  const int row = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  const int r = r0 + row;
  const bool valid = r < s.T;
  // A row past the new ones sees no key (position -1); it runs every loop so that the
  // block's barriers and shuffles stay uniform, and stores nothing.
  const int i = valid ? past + r : -1;

  float q[kDimsPerThread];
  load_row<HD, S>(q, q_rows + static_cast<int64_t>(r) * ld_q + static_cast<int64_t>(h) * hd, valid, part, hd);
  float acc[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) acc[k] = 0.0f;
  float row_max = -INFINITY, row_total = 0.0f;

  const int last_position = past + min(r0 + kRows, s.T) - 1;
  for (int j0 = 0; j0 <= last_position; j0 += kRows) {
    load_tile<HD, S>(k_tile, head_k, ld_kv, j0, keys, hd);
    load_tile<HD, S>(v_tile, head_v, ld_kv, j0, keys, hd);
    __syncthreads();
    online_softmax_tile<HD>(q, k_tile, v_tile, j0, 0, i, scale, part, row_max, row_total, acc);
    __syncthreads();  // the tiles are overwritten next
  }
  if (!valid) return;
  store_out_row<HD, S>(out + static_cast<int64_t>(r) * out_columns(s) + static_cast<int64_t>(h) * hd, acc,
                       row_total, part, hd);
}

// grid (query tiles, n_head, B), kThreads threads. Writes dQ of its rows.
template <int HD, typename S>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(float* dqkv, const float* dout, const typename S::Elem* qkv,
                                 const typename S::Elem* out, const float* lse, AttentionShape s,
                                 const int32_t* key_begin, float scale) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
  constexpr int kRows = TileShape<HD>::kRows;
  __shared__ float k_tile[kRows][HD];
  __shared__ float v_tile[kRows][HD];
  __shared__ int first_keys[kRows];

  const int T = s.T, hd = s.head_dim;
  const int i0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;
  const int kv = h / (s.n_head / s.n_kv_head);
  const int64_t stride = qkv_columns(s);
  const HeadColumns<S> head = head_columns<S>(qkv, s, b, h, kv);

  const int row = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  const int i = i0 + row;
  const bool valid = i < T;
  const int first_key = valid ? first_key_of(key_begin, b, T, i) : T;

  const int64_t out_offset =
      (static_cast<int64_t>(b) * T + i) * out_columns(s) + static_cast<int64_t>(h) * hd;
  float q[kDimsPerThread], dout_row[kDimsPerThread], dq[kDimsPerThread];
  load_row<HD, S>(q, head.q + static_cast<int64_t>(i) * stride, valid, part, hd);
  load_row<HD, Fp32Storage>(dout_row, dout + out_offset, valid, part, hd);
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) dq[k] = 0.0f;
  const float D = row_sum<kThreadsPerRow>(
      partial_dout_dot_out<HD, S>(dout + out_offset, out + out_offset, valid, part, hd));
  const float row_lse = valid ? lse[(static_cast<int64_t>(b) * s.n_head + h) * T + i] : 0.0f;

  if (part == 0) first_keys[row] = first_key;
  __syncthreads();
  const int last_row = min(i0 + kRows, T) - 1;
  for (int j0 = tile_min<kRows>(first_keys) / kRows * kRows; j0 <= last_row; j0 += kRows) {
    load_tile<HD, S>(k_tile, head.k, stride, j0, T, hd);
    load_tile<HD, S>(v_tile, head.v, stride, j0, T, hd);
    __syncthreads();
    for (int j = 0; j < kRows; ++j) {
      float score_partial = 0.0f, dp_partial = 0.0f;
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        score_partial = fmaf(q[k], k_tile[j][part + kThreadsPerRow * k], score_partial);
        dp_partial = fmaf(dout_row[k], v_tile[j][part + kThreadsPerRow * k], dp_partial);
      }
      const float score = row_sum<kThreadsPerRow>(score_partial);
      const float dp = row_sum<kThreadsPerRow>(dp_partial);
      const int key = j0 + j;
      const float p = (key >= first_key && key <= i) ? expf(score * scale - row_lse) : 0.0f;
      const float ds = p * (dp - D) * scale;  // with the scores' 1/sqrt(hd)
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k)
        dq[k] = fmaf(ds, k_tile[j][part + kThreadsPerRow * k], dq[k]);
    }
    __syncthreads();  // the tiles are overwritten next
  }

  if (!valid) return;
  float* dq_row = dqkv + (static_cast<int64_t>(b) * T + i) * stride + static_cast<int64_t>(h) * hd;
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = part + kThreadsPerRow * k;
    if (d < hd) dq_row[d] = dq[k];
  }
}

// grid (key tiles, n_head, B), kThreads threads. Writes dK and dV of its keys for its
// query head: into dqkv's k and v columns (slots null: n_head == n_kv_head), else into
// the head's slot, which gqa_group_sum_kernel adds up.
template <int HD, typename S>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkv_kernel(float* dqkv, float* slots, const float* dout,
                                  const typename S::Elem* qkv, const typename S::Elem* out,
                                  const float* lse, AttentionShape s, const int32_t* key_begin,
                                  float scale) {
  constexpr int kThreadsPerRow = TileShape<HD>::kThreadsPerRow;
  constexpr int kRows = TileShape<HD>::kRows;
  __shared__ float q_tile[kRows][HD];
  __shared__ float dout_tile[kRows][HD];
  __shared__ float lse_tile[kRows];
  __shared__ float d_tile[kRows];
  __shared__ int first_keys[kRows];

  const int T = s.T, hd = s.head_dim;
  const int j0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;
  const int kv = h / (s.n_head / s.n_kv_head);
  const int64_t stride = qkv_columns(s);
  const int64_t out_stride = out_columns(s);

  // This thread's key (its row of the block) and its 32 dimensions.
  const int row = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  const int j = j0 + row;
  const bool key_valid = j < T;
  const HeadColumns<S> head = head_columns<S>(qkv, s, b, h, kv);
  float k_row[kDimsPerThread], v_row[kDimsPerThread], dk[kDimsPerThread], dv[kDimsPerThread];
  load_row<HD, S>(k_row, head.k + static_cast<int64_t>(j) * stride, key_valid, part, hd);
  load_row<HD, S>(v_row, head.v + static_cast<int64_t>(j) * stride, key_valid, part, hd);
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) dk[k] = dv[k] = 0.0f;
  const int last_key = min(j0 + kRows, T) - 1;

  const int64_t head_out = static_cast<int64_t>(b) * T * out_stride + static_cast<int64_t>(h) * hd;
  const float* head_lse = lse + (static_cast<int64_t>(b) * s.n_head + h) * T;
  // Query tiles on the key tiles' grid, from the diagonal on (earlier queries see no
  // key of this tile).
  for (int i0 = j0; i0 < T; i0 += kRows) {
    __syncthreads();  // the previous tile's readers are done with the shared arrays
    // Row `row` of the block stages query i0 + row's scalars.
    const int staged = i0 + row;
    const bool staged_valid = staged < T;
    if (part == 0) {
      first_keys[row] = staged_valid ? first_key_of(key_begin, b, T, staged) : T;
      lse_tile[row] = staged_valid ? head_lse[staged] : 0.0f;
    }
    __syncthreads();
    // Packed documents: a query tile whose queries all start after this key tile
    // sees none of it (uniform over the block).
    if (tile_min<kRows>(first_keys) > last_key) continue;
    load_tile<HD, S>(q_tile, head.q, stride, i0, T, hd);
    load_tile<HD, Fp32Storage>(dout_tile, dout + head_out, out_stride, i0, T, hd);
    const int64_t staged_offset = head_out + static_cast<int64_t>(staged) * out_stride;
    const float D = row_sum<kThreadsPerRow>(partial_dout_dot_out<HD, S>(
        dout + staged_offset, out + staged_offset, staged_valid, part, hd));
    if (part == 0) d_tile[row] = D;
    __syncthreads();

    for (int ii = 0; ii < kRows; ++ii) {
      const int i = i0 + ii;
      float score_partial = 0.0f, dp_partial = 0.0f;
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        score_partial = fmaf(q_tile[ii][part + kThreadsPerRow * k], k_row[k], score_partial);
        dp_partial = fmaf(dout_tile[ii][part + kThreadsPerRow * k], v_row[k], dp_partial);
      }
      const float score = row_sum<kThreadsPerRow>(score_partial);
      const float dp = row_sum<kThreadsPerRow>(dp_partial);
      // Query i sees key j when first_key(i) <= j <= i (a query past T has first key
      // T: it sees nothing; a key past T is invalid).
      const bool visible = key_valid && j >= first_keys[ii] && j <= i;
      const float p = visible ? expf(score * scale - lse_tile[ii]) : 0.0f;
      const float ds = p * (dp - d_tile[ii]) * scale;
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        dv[k] = fmaf(p, dout_tile[ii][part + kThreadsPerRow * k], dv[k]);
        dk[k] = fmaf(ds, q_tile[ii][part + kThreadsPerRow * k], dk[k]);
      }
    }
  }

  if (!key_valid) return;
  const int64_t n = static_cast<int64_t>(b) * T + j;
  float* dk_row = slots != nullptr
                      ? slots + n * out_stride + static_cast<int64_t>(h) * hd
                      : dqkv + n * stride + static_cast<int64_t>(s.n_head + kv) * hd;
  float* dv_row = slots != nullptr
                      ? dk_row + static_cast<int64_t>(s.B) * T * out_stride
                      : dk_row + static_cast<int64_t>(s.n_kv_head) * hd;
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = part + kThreadsPerRow * k;
    if (d < hd) {
      dk_row[d] = dk[k];
      dv_row[d] = dv[k];
    }
  }
}

// GQA: dK and dV of each kv head = its query heads' slots added in head order (the
// first copied, the others added one by one, as cpu::attention_backward does).
// Grid-stride over (k or v, row, kv head, dimension).
__global__ void gqa_group_sum_kernel(float* dqkv, const float* slots, AttentionShape s) {
  const int hd = s.head_dim, group = s.n_head / s.n_kv_head;
  const int64_t N = static_cast<int64_t>(s.B) * s.T;
  const int64_t per_row = static_cast<int64_t>(s.n_kv_head) * hd;
  const int64_t total = 2 * N * per_row;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t which = idx / (N * per_row);  // 0: k, 1: v
    const int64_t rest = idx - which * N * per_row;
    const int64_t n = rest / per_row;
    const int g = static_cast<int>((rest - n * per_row) / hd);
    const int d = static_cast<int>(rest - n * per_row - static_cast<int64_t>(g) * hd);
    const float* first = slots + (which * N + n) * out_columns(s) +
                         static_cast<int64_t>(g) * group * hd + d;
    float sum = first[0];
    for (int r = 1; r < group; ++r) sum += first[static_cast<int64_t>(r) * hd];
    dqkv[n * qkv_columns(s) + static_cast<int64_t>(s.n_head + which * s.n_kv_head + g) * hd + d] =
        sum;
  }
}

void check_call(const char* what, const AttentionShape& s, DType out_type, DType qkv_type) {
  if (s.B <= 0 || s.T <= 0 || s.n_head <= 0 || s.n_kv_head <= 0 || s.n_head % s.n_kv_head != 0 ||
      s.head_dim < 1 || s.head_dim > kAttentionMaxHeadDim)
    throw_kernel_argument_error(
        std::string(what) + ": bad shape (B " + std::to_string(s.B) + ", T " +
        std::to_string(s.T) + ", n_head " + std::to_string(s.n_head) + ", n_kv_head " +
        std::to_string(s.n_kv_head) + ", head_dim " + std::to_string(s.head_dim) +
        "); expected positive sizes, n_head a multiple of n_kv_head, head_dim 1.." +
        std::to_string(kAttentionMaxHeadDim));
  if (out_type != qkv_type)
    throw_kernel_argument_error(std::string(what) + ": output is " +
                                std::string(dtype_name(out_type)) + " but qkv is " +
                                std::string(dtype_name(qkv_type)) + "; expected one type");
  if (s.B > 65535 || s.n_head > 65535)
    throw_kernel_argument_error(std::string(what) + ": B " + std::to_string(s.B) + " or n_head " +
                                std::to_string(s.n_head) + " above the grid's 65535");
}

// Calls f(HD-bucket instance, storage) for the call's head_dim and type.
template <typename F>
void dispatch(const AttentionShape& s, DType dtype, F&& f) {
  auto with_storage = [&](auto head_dim_bucket) {
    switch (dtype) {
      case DType::fp32: f(head_dim_bucket, Fp32Storage{}); return;
      case DType::bf16: f(head_dim_bucket, Bf16Storage{}); return;
      case DType::fp16: f(head_dim_bucket, Fp16Storage{}); return;
    }
  };
  if (s.head_dim <= 64)
    with_storage(std::integral_constant<int, 64>{});
  else
    with_storage(std::integral_constant<int, 128>{});
}

float softmax_scale(const AttentionShape& s) {
  return 1.0f / std::sqrt(static_cast<float>(s.head_dim));  // as the CPU kernels
}

}  // namespace

void attention_forward(cudaStream_t stream, TypedPtr out, float* lse, ConstTypedPtr qkv,
                       const AttentionShape& s, const int32_t* key_begin) {
  check_call("cuda attention_forward", s, out.dtype, qkv.dtype);
  dispatch(s, qkv.dtype, [&](auto head_dim_bucket, auto storage) {
    constexpr int HD = decltype(head_dim_bucket)::value;
    using S = decltype(storage);
    using Elem = typename S::Elem;
    constexpr int kRows = TileShape<HD>::kRows;
    const dim3 grid((s.T + kRows - 1) / kRows, s.n_head, s.B);
    auto* kernel = &attention_forward_kernel<HD, S>;
    SHARDLM_LAUNCH_KERNEL("attention_forward_kernel", kernel, grid, kThreads, stream,
                          static_cast<Elem*>(out.data), lse,
                          static_cast<const Elem*>(qkv.data), s, key_begin, softmax_scale(s));
  });
}

void attention_forward_cached(cudaStream_t stream, TypedPtr out, ConstTypedPtr q, int64_t ld_q,
                              ConstTypedPtr k, ConstTypedPtr v, int64_t ld_kv, const AttentionShape& s,
                              int past) {
  const char* what = "cuda attention_forward_cached";
  check_call(what, s, out.dtype, q.dtype);
  if (s.B != 1 || past < 0)
    throw_kernel_argument_error(std::string(what) + ": batch " + std::to_string(s.B) + ", past " +
                                std::to_string(past) + "; expected one sequence and past >= 0");
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    throw_kernel_argument_error(std::string(what) + ": q is " + std::string(dtype_name(q.dtype)) + ", k " +
                                std::string(dtype_name(k.dtype)) + ", v " + std::string(dtype_name(v.dtype)) +
                                "; expected one type");
  const int64_t kv_columns = static_cast<int64_t>(s.n_kv_head) * s.head_dim;
  if (ld_q < s.out_columns() || ld_kv < kv_columns)
    throw_kernel_argument_error(std::string(what) + ": row strides " + std::to_string(ld_q) + " (q) and " +
                                std::to_string(ld_kv) + " (k, v) are shorter than the rows " +
                                std::to_string(s.out_columns()) + " and " + std::to_string(kv_columns));
  dispatch(s, q.dtype, [&](auto head_dim_bucket, auto storage) {
    constexpr int HD = decltype(head_dim_bucket)::value;
    using S = decltype(storage);
    using Elem = typename S::Elem;
    constexpr int kRows = TileShape<HD>::kRows;
    const dim3 grid((s.T + kRows - 1) / kRows, s.n_head, 1);
    auto* kernel = &attention_forward_cached_kernel<HD, S>;
    SHARDLM_LAUNCH_KERNEL("attention_forward_cached_kernel", kernel, grid, kThreads, stream,
                          static_cast<Elem*>(out.data), static_cast<const Elem*>(q.data), ld_q,
                          static_cast<const Elem*>(k.data), static_cast<const Elem*>(v.data), ld_kv, s,
                          past, softmax_scale(s));
  });
}

size_t attention_backward_scratch_bytes(const AttentionShape& s) {
  if (s.n_head == s.n_kv_head) return 0;
  return 2 * static_cast<size_t>(s.B) * static_cast<size_t>(s.T) *
         static_cast<size_t>(s.n_head) * static_cast<size_t>(s.head_dim) * sizeof(float);
}

void attention_backward(cudaStream_t stream, float* dqkv, const float* dout, ConstTypedPtr qkv,
                        ConstTypedPtr out, const float* lse, const AttentionShape& s,
                        const int32_t* key_begin, float* gqa_scratch) {
  check_call("cuda attention_backward", s, out.dtype, qkv.dtype);
  const bool gqa = s.n_head != s.n_kv_head;
  if (gqa && gqa_scratch == nullptr)
    throw_kernel_argument_error("cuda attention_backward: GQA (n_head " + std::to_string(s.n_head) +
                                ", n_kv_head " + std::to_string(s.n_kv_head) +
                                ") needs attention_backward_scratch_bytes() of scratch; got none");
  float* slots = gqa ? gqa_scratch : nullptr;
  dispatch(s, qkv.dtype, [&](auto head_dim_bucket, auto storage) {
    constexpr int HD = decltype(head_dim_bucket)::value;
    using S = decltype(storage);
    using Elem = typename S::Elem;
    constexpr int kRows = TileShape<HD>::kRows;
    const int tiles = (s.T + kRows - 1) / kRows;
    const Elem* qkv_elems = static_cast<const Elem*>(qkv.data);
    const Elem* out_elems = static_cast<const Elem*>(out.data);
    // The two kernels write disjoint columns of dqkv (q; k and v), so they need no order.
    auto* dq_kernel = &attention_backward_dq_kernel<HD, S>;
    SHARDLM_LAUNCH_KERNEL("attention_backward_dq_kernel", dq_kernel, dim3(tiles, s.n_head, s.B),
                          kThreads, stream, dqkv, dout, qkv_elems, out_elems, lse, s, key_begin,
                          softmax_scale(s));
    auto* dkv_kernel = &attention_backward_dkv_kernel<HD, S>;
    SHARDLM_LAUNCH_KERNEL("attention_backward_dkv_kernel", dkv_kernel,
                          dim3(tiles, s.n_head, s.B), kThreads, stream, dqkv, slots, dout,
                          qkv_elems, out_elems, lse, s, key_begin, softmax_scale(s));
  });
  if (gqa) {
    const int64_t total = 2 * static_cast<int64_t>(s.B) * s.T * s.n_kv_head * s.head_dim;
    const int64_t needed = (total + 255) / 256;
    const int blocks = static_cast<int>(needed < 4096 ? needed : 4096);
    SHARDLM_LAUNCH_KERNEL("gqa_group_sum_kernel", gqa_group_sum_kernel, blocks, 256, stream, dqkv,
                          slots, s);
  }
}

}  // namespace shardlm::cuda
