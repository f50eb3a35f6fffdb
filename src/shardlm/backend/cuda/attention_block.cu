// Ring attention's block kernels on CUDA cores (the contract: backend/cpu/attention_block.hpp).
//
// Layout: one warp per block of the grid, one query (or key) row and head per warp. A
// lane holds the dimensions d = lane + 32 c (c < kChunks) of the row, zeros past
// head_dim; a dot product is the lanes' partial sums combined by xor-shuffles
// (device::warp_sum), which give every lane the same bits, so a warp's branches never
// diverge. One warp per grid block because a row's loop runs over the keys its
// key_range gives it, which differ from row to row: warps of one block would reach
// different numbers of shuffles, which is fine on a GPU but not under the host-fiber
// emulation (tests/cuda_emulation), which runs a block's shuffles as block-wide rounds.
//
// Kernels (fp32 arithmetic on the stored values, widened exactly; exp and log by expf
// and logf, so within a few ulps of the CPU's std::exp / std::log):
//  - forward: a warp per (query, head): the scores' maximum over the query's keys, then
//    the probabilities, their sum and the weighted values, in key order (the CPU's two
//    passes); out = 0 and lse = -inf for a query that sees no key.
//  - backward dQ: a warp per (query, head), over the query's keys in order.
//  - backward dK, dV: a warp per (key, kv head), over its group's query heads in head
//    order, then the queries that see the key in order (the CPU kernel's sums).
//    D_i = dO_i . O_i is recomputed in both backward kernels by the same code.
//  - merge: a thread per (query, head) row.
// No atomics: every sum runs in a fixed order, so runs repeat bit for bit. Not tuned (a
// block's keys are read from global memory once per query, as the KV cache's kernel
// does); the ring's share of a step is to be measured on a card before it is tiled.
//
// key_range: the CPU rejects ranges outside [0, kv_len]; a kernel cannot throw, so they
// are clamped into it (no out-of-range reads).
#include "shardlm/backend/cuda/attention_block.cuh"

#include <cmath>
#include <string>

#include "shardlm/backend/cuda/device_math.cuh"
#include "shardlm/backend/cuda/kernel_launch.hpp"

namespace shardlm::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kChunks = (kAttentionMaxHeadDim + kWarp - 1) / kWarp;

struct BlockDims {  // AttentionBlockShape's helpers are host functions; the kernels use these
  int B, q_len, kv_len, n_head, n_kv_head, head_dim;
  __device__ int group_size() const { return n_head / n_kv_head; }
  __device__ int64_t q_columns() const { return static_cast<int64_t>(n_head) * head_dim; }
  __device__ int64_t kv_columns() const { return static_cast<int64_t>(2 * n_kv_head) * head_dim; }
};

BlockDims dims_of(const AttentionBlockShape& s) {
  return {s.B, s.q_len, s.kv_len, s.n_head, s.n_kv_head, s.head_dim};
}

// A row's head_dim values at `base` (this lane's dimensions), zeros past head_dim.
template <typename T>
__device__ __forceinline__ void load_row(float (&v)[kChunks], const typename T::Storage* p,
                                         int64_t base, int hd) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + kWarp * c;
    v[c] = d < hd ? T::load(p, base + d) : 0.0f;
  }
}

__device__ __forceinline__ float row_dot(const float (&a)[kChunks], const float (&b)[kChunks]) {
  float partial = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) partial += a[c] * b[c];
  return device::warp_sum(partial);
}

// Query `query`'s keys [first, end) of its block, clamped into [0, kv_len].
__device__ __forceinline__ void query_keys(const int32_t* key_range, int64_t query, int kv_len,
                                           int& first, int& end) {
  first = max(0, min(key_range[2 * query], kv_len));
  end = max(0, min(key_range[2 * query + 1], kv_len));
}

template <typename T>
__global__ void __launch_bounds__(kWarp)
block_forward_kernel(float* out, float* lse, const typename T::Storage* q, int64_t ld_q,
                     const typename T::Storage* kv, BlockDims s, const int32_t* key_range,
                     float scale) {
  const int64_t query = blockIdx.x;  // b * q_len + i
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(query / s.q_len), i = static_cast<int>(query % s.q_len);
  const int lane = static_cast<int>(threadIdx.x), hd = s.head_dim;
  const int g = h / s.group_size();
  const int64_t ld_kv = s.kv_columns();
  float* o = out + query * s.q_columns() + static_cast<int64_t>(h) * hd;
  float& row_lse = lse[(static_cast<int64_t>(b) * s.n_head + h) * s.q_len + i];
  int first, end;
  query_keys(key_range, query, s.kv_len, first, end);
  if (first >= end) {  // the whole warp: no key
    for (int d = lane; d < hd; d += kWarp) o[d] = 0.0f;
    if (lane == 0) row_lse = -INFINITY;
    return;
  }
  float qv[kChunks], kj[kChunks], vj[kChunks], acc[kChunks];
  load_row<T>(qv, q, query * ld_q + static_cast<int64_t>(h) * hd, hd);
  const int64_t row0 = static_cast<int64_t>(b) * s.kv_len * ld_kv;
  const int64_t k_col = static_cast<int64_t>(g) * hd, v_col = static_cast<int64_t>(s.n_kv_head + g) * hd;
  float best = -INFINITY;
  for (int j = first; j < end; ++j) {
    load_row<T>(kj, kv, row0 + j * ld_kv + k_col, hd);
    best = fmaxf(best, row_dot(qv, kj) * scale);
  }
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0.0f;
  for (int j = first; j < end; ++j) {
    load_row<T>(kj, kv, row0 + j * ld_kv + k_col, hd);
    load_row<T>(vj, kv, row0 + j * ld_kv + v_col, hd);
    const float p = expf(row_dot(qv, kj) * scale - best);
    sum += p;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[c] += p * vj[c];
  }
  const float inv = 1.0f / sum;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + kWarp * c;
    if (d < hd) o[d] = acc[c] * inv;
  }
  if (lane == 0) row_lse = best + logf(sum);
}

template <typename T>
__global__ void __launch_bounds__(kWarp)
block_backward_dq_kernel(float* dq, const float* dout, const typename T::Storage* out,
                         const float* lse, const typename T::Storage* q, int64_t ld_q,
                         const typename T::Storage* kv, BlockDims s, const int32_t* key_range,
                         float scale) {
  const int64_t query = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(query / s.q_len), i = static_cast<int>(query % s.q_len);
  const int lane = static_cast<int>(threadIdx.x), hd = s.head_dim;
  const int g = h / s.group_size();
  int first, end;
  query_keys(key_range, query, s.kv_len, first, end);
  if (first >= end) return;  // the whole warp
  const int64_t ld_kv = s.kv_columns(), ld_out = s.q_columns();
  const int64_t head_col = static_cast<int64_t>(h) * hd;
  float qv[kChunks], ov[kChunks], dov[kChunks], kj[kChunks], vj[kChunks], acc[kChunks];
  load_row<T>(qv, q, query * ld_q + head_col, hd);
  load_row<T>(ov, out, query * ld_out + head_col, hd);
  load_row<device::F32>(dov, dout, query * ld_out + head_col, hd);
  const float D = row_dot(dov, ov);
  const float row_lse = lse[(static_cast<int64_t>(b) * s.n_head + h) * s.q_len + i];
  const int64_t row0 = static_cast<int64_t>(b) * s.kv_len * ld_kv;
  const int64_t k_col = static_cast<int64_t>(g) * hd, v_col = static_cast<int64_t>(s.n_kv_head + g) * hd;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0.0f;
  for (int j = first; j < end; ++j) {
    load_row<T>(kj, kv, row0 + j * ld_kv + k_col, hd);
    load_row<T>(vj, kv, row0 + j * ld_kv + v_col, hd);
    const float p = expf(row_dot(qv, kj) * scale - row_lse);
    const float ds = p * (row_dot(dov, vj) - D) * scale;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[c] += ds * kj[c];
  }
  float* dq_row = dq + query * ld_out + head_col;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + kWarp * c;
    if (d < hd) dq_row[d] += acc[c];
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarp)
block_backward_dkv_kernel(float* dkv, const float* dout, const typename T::Storage* out,
                          const float* lse, const typename T::Storage* q, int64_t ld_q,
                          const typename T::Storage* kv, BlockDims s, const int32_t* key_range,
                          float scale) {
  const int64_t key = blockIdx.x;  // b * kv_len + j
  const int g = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(key / s.kv_len), j = static_cast<int>(key % s.kv_len);
  const int lane = static_cast<int>(threadIdx.x), hd = s.head_dim;
  const int64_t ld_kv = s.kv_columns(), ld_out = s.q_columns();
  const int64_t k_col = static_cast<int64_t>(g) * hd, v_col = static_cast<int64_t>(s.n_kv_head + g) * hd;
  float kj[kChunks], vj[kChunks], qv[kChunks], ov[kChunks], dov[kChunks], dk[kChunks], dv[kChunks];
  load_row<T>(kj, kv, key * ld_kv + k_col, hd);
  load_row<T>(vj, kv, key * ld_kv + v_col, hd);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) dk[c] = dv[c] = 0.0f;
  for (int h = g * s.group_size(); h < (g + 1) * s.group_size(); ++h) {
    const int64_t head_col = static_cast<int64_t>(h) * hd;
    for (int i = 0; i < s.q_len; ++i) {
      const int64_t query = static_cast<int64_t>(b) * s.q_len + i;
      int first, end;
      query_keys(key_range, query, s.kv_len, first, end);
      if (j < first || j >= end) continue;  // the whole warp
      load_row<T>(qv, q, query * ld_q + head_col, hd);
      load_row<T>(ov, out, query * ld_out + head_col, hd);
      load_row<device::F32>(dov, dout, query * ld_out + head_col, hd);
      const float D = row_dot(dov, ov);
      const float row_lse = lse[(static_cast<int64_t>(b) * s.n_head + h) * s.q_len + i];
      const float p = expf(row_dot(qv, kj) * scale - row_lse);
      const float ds = p * (row_dot(dov, vj) - D) * scale;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        dk[c] += ds * qv[c];
        dv[c] += p * dov[c];
      }
    }
  }
  float* row = dkv + key * ld_kv;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + kWarp * c;
    if (d < hd) {
      row[k_col + d] += dk[c];
      row[v_col + d] += dv[c];
    }
  }
}

__global__ void lse_merge_kernel(float* out, float* lse, const float* block_out,
                                 const float* block_lse, BlockDims s) {
  const int64_t rows = static_cast<int64_t>(s.B) * s.n_head * s.q_len;  // lse's order
  const int hd = s.head_dim;
  const int64_t ld_out = s.q_columns();
  for (int64_t r = device::grid_first(); r < rows; r += device::grid_stride()) {
    const float theirs = block_lse[r];
    if (theirs == -INFINITY) continue;
    const int64_t b = r / (static_cast<int64_t>(s.n_head) * s.q_len);
    const int64_t h = r / s.q_len % s.n_head, i = r % s.q_len;
    float* o = out + (b * s.q_len + i) * ld_out + h * hd;
    const float* bo = block_out + (b * s.q_len + i) * ld_out + h * hd;
    const float ours = lse[r];
    if (ours == -INFINITY) {
      for (int d = 0; d < hd; ++d) o[d] = bo[d];
      lse[r] = theirs;
      continue;
    }
    const float best = fmaxf(ours, theirs);
    const float w_ours = expf(ours - best), w_theirs = expf(theirs - best);
    const float sum = w_ours + w_theirs;
    const float a = w_ours / sum, c = w_theirs / sum;
    for (int d = 0; d < hd; ++d) o[d] = o[d] * a + bo[d] * c;
    lse[r] = best + logf(sum);
  }
}

void check_block_call(const char* what, const AttentionBlockShape& s, DType q_type, DType kv_type) {
  if (s.B <= 0 || s.q_len <= 0 || s.kv_len <= 0 || s.n_head <= 0 || s.n_kv_head <= 0 ||
      s.n_head % s.n_kv_head != 0 || s.head_dim < 1 || s.head_dim > kAttentionMaxHeadDim)
    throw_kernel_argument_error(
        std::string(what) + ": bad shape (B " + std::to_string(s.B) + ", " +
        std::to_string(s.q_len) + " queries and " + std::to_string(s.kv_len) +
        " keys per row, n_head " + std::to_string(s.n_head) + ", n_kv_head " +
        std::to_string(s.n_kv_head) + ", head_dim " + std::to_string(s.head_dim) +
        "); expected positive sizes, n_head a multiple of n_kv_head, head_dim 1.." +
        std::to_string(kAttentionMaxHeadDim));
  if (q_type != kv_type)
    throw_kernel_argument_error(std::string(what) + ": q is " + std::string(dtype_name(q_type)) +
                                " but k|v is " + std::string(dtype_name(kv_type)) +
                                "; expected one type");
  if (s.n_head > 65535 || s.n_kv_head > 65535)
    throw_kernel_argument_error(std::string(what) + ": n_head " + std::to_string(s.n_head) +
                                " above the grid's 65535");
}

float block_scale(const AttentionBlockShape& s) {
  return 1.0f / std::sqrt(static_cast<float>(s.head_dim));  // as the CPU kernels
}

}  // namespace

void attention_block_forward(cudaStream_t stream, float* out, float* lse, ConstTypedPtr q,
                             int64_t ld_q, ConstTypedPtr kv, const AttentionBlockShape& s,
                             const int32_t* key_range) {
  check_block_call("cuda attention_block_forward", s, q.dtype, kv.dtype);
  device::with_type(q.dtype, [&](auto tag) {
    using T = decltype(tag);
    using Elem = typename T::Storage;
    auto* kernel = &block_forward_kernel<T>;
    SHARDLM_LAUNCH_KERNEL("attention_block_forward_kernel", kernel,
                          dim3(static_cast<unsigned>(s.B * s.q_len), static_cast<unsigned>(s.n_head)),
                          kWarp, stream, out, lse, static_cast<const Elem*>(q.data), ld_q,
                          static_cast<const Elem*>(kv.data), dims_of(s), key_range, block_scale(s));
  });
}

void attention_block_backward(cudaStream_t stream, float* dq, float* dkv, const float* dout,
                              ConstTypedPtr out, const float* lse, ConstTypedPtr q, int64_t ld_q,
                              ConstTypedPtr kv, const AttentionBlockShape& s,
                              const int32_t* key_range) {
  const char* what = "cuda attention_block_backward";
  check_block_call(what, s, q.dtype, kv.dtype);
  if (out.dtype != q.dtype)
    throw_kernel_argument_error(std::string(what) + ": out is " + std::string(dtype_name(out.dtype)) +
                                " but q is " + std::string(dtype_name(q.dtype)) + "; expected one type");
  device::with_type(q.dtype, [&](auto tag) {
    using T = decltype(tag);
    using Elem = typename T::Storage;
    const Elem* q_elems = static_cast<const Elem*>(q.data);
    const Elem* kv_elems = static_cast<const Elem*>(kv.data);
    const Elem* out_elems = static_cast<const Elem*>(out.data);
    // The two kernels add to different arrays (dq; dkv), so they need no order.
    auto* dq_kernel = &block_backward_dq_kernel<T>;
    SHARDLM_LAUNCH_KERNEL("attention_block_backward_dq_kernel", dq_kernel,
                          dim3(static_cast<unsigned>(s.B * s.q_len), static_cast<unsigned>(s.n_head)),
                          kWarp, stream, dq, dout, out_elems, lse, q_elems, ld_q, kv_elems,
                          dims_of(s), key_range, block_scale(s));
    auto* dkv_kernel = &block_backward_dkv_kernel<T>;
    SHARDLM_LAUNCH_KERNEL("attention_block_backward_dkv_kernel", dkv_kernel,
                          dim3(static_cast<unsigned>(s.B * s.kv_len), static_cast<unsigned>(s.n_kv_head)),
                          kWarp, stream, dkv, dout, out_elems, lse, q_elems, ld_q, kv_elems,
                          dims_of(s), key_range, block_scale(s));
  });
}

void attention_lse_merge(cudaStream_t stream, float* out, float* lse, const float* block_out,
                         const float* block_lse, const AttentionBlockShape& s) {
  check_block_call("cuda attention_lse_merge", s, DType::fp32, DType::fp32);
  const int64_t rows = static_cast<int64_t>(s.B) * s.n_head * s.q_len;
  const int64_t needed = (rows + 255) / 256;
  const int blocks = static_cast<int>(needed < 4096 ? needed : 4096);
  SHARDLM_LAUNCH_KERNEL("attention_lse_merge_kernel", lse_merge_kernel, blocks, 256, stream, out,
                        lse, block_out, block_lse, dims_of(s));
}

}  // namespace shardlm::cuda
