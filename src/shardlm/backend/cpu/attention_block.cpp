#include "shardlm/backend/cpu/attention_block.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "shardlm/backend/cpu/attention_tiles.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

using namespace attention_tiles;

void check_block(const AttentionBlockShape& s, DType q_type, DType kv_type,
                 const int32_t* key_range) {
  SHARDLM_CHECK(s.B > 0 && s.q_len > 0 && s.kv_len > 0,
                "attention block: batch {}, {} queries and {} keys per row must be positive", s.B,
                s.q_len, s.kv_len);
  SHARDLM_CHECK(s.n_head > 0 && s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0,
                "attention block: n_head {} must be a positive multiple of n_kv_head {}",
                s.n_head, s.n_kv_head);
  SHARDLM_CHECK(s.head_dim >= 1 && s.head_dim <= kAttentionMaxHeadDim,
                "attention block: head_dim {} outside the supported 1..{}", s.head_dim,
                kAttentionMaxHeadDim);
  SHARDLM_CHECK(q_type == kv_type, "attention block: q is {} but k|v is {}; expected one type",
                dtype_name(q_type), dtype_name(kv_type));
  const int64_t queries = static_cast<int64_t>(s.B) * s.q_len;
  for (int64_t i = 0; i < queries; ++i) {
    const int32_t first = key_range[2 * i], end = key_range[2 * i + 1];
    SHARDLM_CHECK(first >= 0 && end <= s.kv_len,
                  "attention block: query {} sees keys [{}, {}), outside the block's [0, {})", i,
                  first, end, s.kv_len);
  }
}

// The queries [query0, query0 + nq) see, together, the keys [lo, hi) of the block (the
// union of their ranges' span; lo >= hi: none of them sees a key).
struct KeySpan {
  int lo = 0, hi = 0;
  bool overlaps(int j0, int nk) const { return lo < hi && lo < j0 + nk && hi > j0; }
};
KeySpan key_span(const int32_t* key_range, int64_t query0, int nq) {
  KeySpan span{INT32_MAX, 0};
  for (int ii = 0; ii < nq; ++ii) {
    const int32_t first = key_range[2 * (query0 + ii)], end = key_range[2 * (query0 + ii) + 1];
    if (first >= end) continue;
    span.lo = std::min(span.lo, first);
    span.hi = std::max(span.hi, end);
  }
  return span;
}

// Of the key block starting at j0 with nk keys, the query with range [first, end) sees
// the block's keys [visible_first, visible_end) (visible_first >= visible_end: none).
struct BlockKeys {
  int first, end;
};
BlockKeys block_keys(const int32_t* range, int j0, int nk) {
  return {std::min(std::max(0, range[0] - j0), kBlock), std::max(0, std::min(range[1] - j0, nk))};
}

// The layout of one (batch row, kv head) of q, k|v, out and lse.
struct BlockView {
  int64_t q_row0;    // element offset of the batch row's first query row in q
  int64_t kv_row0;   // of its first key row in k|v
  int64_t out_row0;  // of its first row in out / dout / dq
  int64_t ld_kv, ld_out;
};

BlockView block_view(const AttentionBlockShape& s, int64_t ld_q, int b) {
  return {static_cast<int64_t>(b) * s.q_len * ld_q, static_cast<int64_t>(b) * s.kv_len * s.kv_columns(),
          static_cast<int64_t>(b) * s.q_len * s.q_columns(), s.kv_columns(), s.q_columns()};
}

// The transposed key (or value) blocks of kv head column `col` of a batch row:
// [kv_len / kBlock rounded up][hd][kBlock], zero-padded.
template <typename S>
void transpose_key_blocks(float* dst, const typename S::Elem* kv, const BlockView& view,
                          int64_t col, const AttentionBlockShape& s) {
  const int hd = s.head_dim;
  for (int j0 = 0; j0 < s.kv_len; j0 += kBlock)
    transpose_block<S>(dst + static_cast<int64_t>(j0 / kBlock) * hd * kBlock,
                       kv + view.kv_row0 + j0 * view.ld_kv + col, view.ld_kv,
                       std::min(kBlock, s.kv_len - j0), hd);
}

// One (batch row, query head) of the forward: a query block at a time, an online
// softmax over the key blocks its queries see (attention.cpp's forward_query_block with
// arbitrary per-query key ranges instead of the causal prefix).
template <typename S>
void forward_head(float* out, float* lse, const typename S::Elem* q, int64_t ld_q,
                  const typename S::Elem* kv, const AttentionBlockShape& s,
                  const int32_t* key_range, int b, int h) {
  const int hd = s.head_dim, g = h / s.group_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const BlockView view = block_view(s, ld_q, b);
  const int num_key_blocks = (s.kv_len + kBlock - 1) / kBlock;
  float* q_all = head_scratch(static_cast<size_t>(s.q_len + s.kv_len) * hd +
                              static_cast<size_t>(num_key_blocks) * hd * kBlock);
  float* v_all = q_all + static_cast<int64_t>(s.q_len) * hd;
  float* k_t_all = v_all + static_cast<int64_t>(s.kv_len) * hd;
  load_tile<S>(q_all, q + view.q_row0 + static_cast<int64_t>(h) * hd, ld_q, s.q_len, hd);
  load_tile<S>(v_all, kv + view.kv_row0 + static_cast<int64_t>(s.n_kv_head + g) * hd, view.ld_kv,
               s.kv_len, hd);
  transpose_key_blocks<S>(k_t_all, kv, view, static_cast<int64_t>(g) * hd, s);

  alignas(64) float scores[kBlock * kBlock];
  alignas(64) float acc[kBlock * kAttentionMaxHeadDim];
  float row_max[kBlock];
  float row_sum[kBlock];
  for (int i0 = 0; i0 < s.q_len; i0 += kBlock) {
    const int nq = std::min(kBlock, s.q_len - i0);
    const int64_t query0 = static_cast<int64_t>(b) * s.q_len + i0;
    std::fill(acc, acc + nq * hd, 0.0f);
    std::fill(row_max, row_max + nq, -INFINITY);
    std::fill(row_sum, row_sum + nq, 0.0f);
    const KeySpan span = key_span(key_range, query0, nq);
    for (int j0 = span.lo / kBlock * kBlock; j0 < span.hi; j0 += kBlock) {
      const int nk = std::min(kBlock, s.kv_len - j0);
      tile_scores(scores, q_all + static_cast<int64_t>(i0) * hd,
                  k_t_all + static_cast<int64_t>(j0 / kBlock) * hd * kBlock, nq, hd, false);
      for (int ii = 0; ii < nq; ++ii) {
        const BlockKeys keys = block_keys(key_range + 2 * (query0 + ii), j0, nk);
        const float correction = softmax_visible_keys(scores + ii * kBlock, keys.first, keys.end,
                                                      scale, row_max[ii], row_sum[ii]);
        float* a = acc + ii * hd;
#pragma omp simd
        for (int d = 0; d < hd; ++d) a[d] *= correction;
      }
      // acc += P V over the block's keys (probabilities of keys a row does not see are 0).
      tile_gemm(acc, hd, scores, kBlock, 1, v_all + static_cast<int64_t>(j0) * hd, hd, nq, hd, nk);
    }
    for (int ii = 0; ii < nq; ++ii) {
      float* o = out + view.out_row0 + static_cast<int64_t>(i0 + ii) * view.ld_out +
                 static_cast<int64_t>(h) * hd;
      float& row_lse = lse[(static_cast<int64_t>(b) * s.n_head + h) * s.q_len + i0 + ii];
      if (row_sum[ii] == 0.0f) {  // sees no key of this block
        std::fill(o, o + hd, 0.0f);
        row_lse = -INFINITY;
        continue;
      }
      const float inv_sum = 1.0f / row_sum[ii];
      const float* a = acc + ii * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) o[d] = a[d] * inv_sum;
      row_lse = row_max[ii] + std::log(row_sum[ii]);
    }
  }
}

// One (batch row, kv head) of the backward: its key blocks' transposes built once, then
// each query head of its group in order (attention.cpp's backward_head with per-query
// key ranges), the key gradients of every head accumulated in fp32 rows and added to
// dkv at the end, each head's dq added to dq.
template <typename S>
void backward_kv_head(float* dq, float* dkv, const float* dout, const typename S::Elem* out,
                      const float* lse, const typename S::Elem* q, int64_t ld_q,
                      const typename S::Elem* kv, const AttentionBlockShape& s,
                      const int32_t* key_range, int b, int g) {
  const int hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const BlockView view = block_view(s, ld_q, b);
  const int num_key_blocks = (s.kv_len + kBlock - 1) / kBlock;
  const int64_t key_rows = static_cast<int64_t>(s.kv_len) * hd;
  const int64_t query_rows = static_cast<int64_t>(s.q_len) * hd;
  const int64_t key_blocks = static_cast<int64_t>(num_key_blocks) * hd * kBlock;
  float* k_t_all = head_scratch(static_cast<size_t>(2 * key_blocks + 3 * key_rows + 3 * query_rows +
                                                    s.q_len));
  float* v_t_all = k_t_all + key_blocks;
  float* k_all = v_t_all + key_blocks;
  float* dk_all = k_all + key_rows;
  float* dv_all = dk_all + key_rows;
  float* q_all = dv_all + key_rows;
  float* dout_all = q_all + query_rows;
  float* dq_rows = dout_all + query_rows;
  float* D = dq_rows + query_rows;
  const int64_t k_col = static_cast<int64_t>(g) * hd, v_col = static_cast<int64_t>(s.n_kv_head + g) * hd;
  transpose_key_blocks<S>(k_t_all, kv, view, k_col, s);
  transpose_key_blocks<S>(v_t_all, kv, view, v_col, s);
  load_tile<S>(k_all, kv + view.kv_row0 + k_col, view.ld_kv, s.kv_len, hd);
  std::fill(dk_all, dk_all + 2 * key_rows, 0.0f);

  alignas(64) float p[kBlock * kBlock];
  alignas(64) float ds[kBlock * kBlock];
  alignas(64) float out_row[kAttentionMaxHeadDim];
  for (int h = g * s.group_size(); h < (g + 1) * s.group_size(); ++h) {
    const int64_t head_col = static_cast<int64_t>(h) * hd;
    const float* head_lse = lse + (static_cast<int64_t>(b) * s.n_head + h) * s.q_len;
    load_tile<S>(q_all, q + view.q_row0 + head_col, ld_q, s.q_len, hd);
    load_tile<Fp32Storage>(dout_all, dout + view.out_row0 + head_col, view.ld_out, s.q_len, hd);
    // D_i = dout_i . out_i, the softmax Jacobian's row term.
    for (int i = 0; i < s.q_len; ++i) {
      load_tile<S>(out_row, out + view.out_row0 + i * view.ld_out + head_col, view.ld_out, 1, hd);
      const float* dout_row = dout_all + static_cast<int64_t>(i) * hd;
      float d_i = 0.0f;
#pragma omp simd reduction(+ : d_i)
      for (int d = 0; d < hd; ++d) d_i += dout_row[d] * out_row[d];
      D[i] = d_i;
    }
    std::fill(dq_rows, dq_rows + query_rows, 0.0f);
    for (int j0 = 0; j0 < s.kv_len; j0 += kBlock) {
      const int nk = std::min(kBlock, s.kv_len - j0);
      const float* k_t = k_t_all + static_cast<int64_t>(j0 / kBlock) * hd * kBlock;
      const float* v_t = v_t_all + static_cast<int64_t>(j0 / kBlock) * hd * kBlock;
      for (int i0 = 0; i0 < s.q_len; i0 += kBlock) {
        const int nq = std::min(kBlock, s.q_len - i0);
        const int64_t query0 = static_cast<int64_t>(b) * s.q_len + i0;
        if (!key_span(key_range, query0, nq).overlaps(j0, nk)) continue;
        const float* q_rows = q_all + static_cast<int64_t>(i0) * hd;
        const float* dout_rows = dout_all + static_cast<int64_t>(i0) * hd;
        tile_scores(p, q_rows, k_t, nq, hd, false);
        // dP = dO V^T
        std::fill(ds, ds + nq * kBlock, 0.0f);
        tile_gemm(ds, kBlock, dout_rows, hd, 1, v_t, kBlock, nq, kBlock, hd);
        for (int ii = 0; ii < nq; ++ii) {
          const BlockKeys keys = block_keys(key_range + 2 * (query0 + ii), j0, nk);
          float* p_row = p + ii * kBlock;
          float* ds_row = ds + ii * kBlock;
          const FloatVec scale_v = FloatVec{} + scale, lse_v = FloatVec{} + head_lse[i0 + ii],
                         d_v = FloatVec{} + D[i0 + ii];
          for (int l0 = 0; l0 < kBlock; l0 += kVecLanes) {  // keys the row does not see: 0
            const IntVec visible = lanes_within(l0, keys.first, keys.end);
            const FloatVec pj = exp_vec(load_vec(p_row + l0) * scale_v - lse_v);
            const FloatVec dsj = pj * (load_vec(ds_row + l0) - d_v) * scale_v;
            store_vec(p_row + l0, visible ? pj : FloatVec{});
            store_vec(ds_row + l0, visible ? dsj : FloatVec{});
          }
        }
        // dV += P^T dO;  dK += dS^T Q;  dQ += dS K.
        tile_gemm(dv_all + static_cast<int64_t>(j0) * hd, hd, p, 1, kBlock, dout_rows, hd, nk, hd, nq);
        tile_gemm(dk_all + static_cast<int64_t>(j0) * hd, hd, ds, 1, kBlock, q_rows, hd, nk, hd, nq);
        tile_gemm(dq_rows + static_cast<int64_t>(i0) * hd, hd, ds, kBlock, 1,
                  k_all + static_cast<int64_t>(j0) * hd, hd, nq, hd, nk);
      }
    }
    for (int i = 0; i < s.q_len; ++i) {
      float* dst = dq + view.out_row0 + i * view.ld_out + head_col;
      const float* src = dq_rows + static_cast<int64_t>(i) * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) dst[d] += src[d];
    }
  }
  for (int j = 0; j < s.kv_len; ++j) {
    float* row = dkv + view.kv_row0 + j * view.ld_kv;
    const float* dk = dk_all + static_cast<int64_t>(j) * hd;
    const float* dv = dv_all + static_cast<int64_t>(j) * hd;
#pragma omp simd
    for (int d = 0; d < hd; ++d) {
      row[k_col + d] += dk[d];
      row[v_col + d] += dv[d];
    }
  }
}

}  // namespace

void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q,
                             ConstTypedPtr kv, const AttentionBlockShape& s,
                             const int32_t* key_range) {
  const PhaseScope phase(Phase::attention);
  check_block(s, q.dtype, kv.dtype, key_range);
  const int64_t tasks = static_cast<int64_t>(s.B) * s.n_head;
  with_storage(q.dtype, [&](auto storage) {
    using S = decltype(storage);
    using E = typename S::Elem;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task)
      forward_head<S>(out, lse, static_cast<const E*>(q.data), ld_q, static_cast<const E*>(kv.data),
                      s, key_range, static_cast<int>(task / s.n_head),
                      static_cast<int>(task % s.n_head));
  });
}

void attention_block_backward(float* dq, float* dkv, const float* dout, ConstTypedPtr out,
                              const float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                              const AttentionBlockShape& s, const int32_t* key_range) {
  const PhaseScope phase(Phase::attention);
  check_block(s, q.dtype, kv.dtype, key_range);
  SHARDLM_CHECK(out.dtype == q.dtype, "attention block: out is {} but q is {}; expected one type",
                dtype_name(out.dtype), dtype_name(q.dtype));
  // A task per (batch row, kv head): it owns that head's key gradients.
  const int64_t tasks = static_cast<int64_t>(s.B) * s.n_kv_head;
  with_storage(q.dtype, [&](auto storage) {
    using S = decltype(storage);
    using E = typename S::Elem;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task)
      backward_kv_head<S>(dq, dkv, dout, static_cast<const E*>(out.data), lse,
                          static_cast<const E*>(q.data), ld_q, static_cast<const E*>(kv.data), s,
                          key_range, static_cast<int>(task / s.n_kv_head),
                          static_cast<int>(task % s.n_kv_head));
  });
}

void attention_lse_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                         const AttentionBlockShape& s) {
  const PhaseScope phase(Phase::attention);
  const int hd = s.head_dim;
  const int64_t ld_out = s.q_columns();
  const int64_t rows = static_cast<int64_t>(s.B) * s.n_head * s.q_len;  // lse's order
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float theirs = block_lse[r];
    if (theirs == -INFINITY) continue;
    const int64_t b = r / (static_cast<int64_t>(s.n_head) * s.q_len);
    const int64_t h = r / s.q_len % s.n_head, i = r % s.q_len;
    float* o = out + (b * s.q_len + i) * ld_out + h * hd;
    const float* bo = block_out + (b * s.q_len + i) * ld_out + h * hd;
    const float ours = lse[r];
    if (ours == -INFINITY) {
      std::copy(bo, bo + hd, o);
      lse[r] = theirs;
      continue;
    }
    const float max = std::max(ours, theirs);
    const float w_ours = std::exp(ours - max), w_theirs = std::exp(theirs - max);
    const float sum = w_ours + w_theirs;
    const float a = w_ours / sum, c = w_theirs / sum;
    for (int d = 0; d < hd; ++d) o[d] = o[d] * a + bo[d] * c;
    lse[r] = max + std::log(sum);
  }
}

}  // namespace shardlm::cpu
