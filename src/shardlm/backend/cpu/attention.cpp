#include "shardlm/backend/cpu/attention.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/backend/cpu/attention_bf16.hpp"
#include "shardlm/backend/cpu/attention_tiles.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

using namespace attention_tiles;

void check_shape(const AttentionShape& s) {
  SHARDLM_CHECK(s.B > 0 && s.T > 0, "attention: batch {} and sequence length {} must be positive",
                s.B, s.T);
  SHARDLM_CHECK(s.n_head > 0 && s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0,
                "attention: n_head {} must be a positive multiple of n_kv_head {}", s.n_head,
                s.n_kv_head);
  SHARDLM_CHECK(s.head_dim >= 1 && s.head_dim <= kAttentionMaxHeadDim,
                "attention: head_dim {} outside the supported 1..{}", s.head_dim,
                kAttentionMaxHeadDim);
}

// Every query sees a non-empty key range [key_begin, t] of its own sequence.
void check_key_begin(const int32_t* key_begin, const AttentionShape& s) {
  if (key_begin == nullptr) return;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t) {
      const int32_t begin = key_begin[static_cast<int64_t>(b) * s.T + t];
      SHARDLM_CHECK(begin >= 0 && begin <= t,
                    "attention: key_begin[{}] = {} outside [0, {}] (batch row {}, position {})",
                    static_cast<int64_t>(b) * s.T + t, begin, t, b, t);
    }
}

// Where one (batch, query head) lives in the qkv / out / lse tensors, and the key
// range of its queries.
template <typename S>
struct HeadView {
  const typename S::Elem* q;
  const typename S::Elem* k;  // the query head's kv head
  const typename S::Elem* v;
  int64_t qkv_stride;  // (n_head + 2 n_kv_head) hd
  int64_t out_stride;  // n_head hd
  int64_t out_offset;  // of row 0, head h in out / dout
  int64_t lse_offset;
  const int32_t* key_begin;  // row 0 of the batch row, or null (every query from key 0)
  int hd;

  // Of the key block starting at j0 with nk keys, query i sees keys j0 + [first, visible):
  // the causal prefix, from its key_begin on (first >= visible: none of them).
  int first_key(int i, int j0) const {
    return key_begin == nullptr ? 0 : std::max(0, key_begin[i] - j0);
  }
  // The smallest key any of the queries [i0, i0 + nq) sees.
  int min_key(int i0, int nq) const {
    if (key_begin == nullptr) return 0;
    return *std::min_element(key_begin + i0, key_begin + i0 + nq);
  }
};

template <typename S>
HeadView<S> head_view(const typename S::Elem* qkv, int b, int h, const AttentionShape& s,
                      const int32_t* key_begin) {
  const int hd = s.head_dim;
  const int kv = h / s.group_size();
  const int64_t stride = s.qkv_columns();
  const typename S::Elem* row0 = qkv + static_cast<int64_t>(b) * s.T * stride;
  return {row0 + static_cast<int64_t>(h) * hd,
          row0 + static_cast<int64_t>(s.n_head + kv) * hd,
          row0 + static_cast<int64_t>(s.n_head + s.n_kv_head + kv) * hd,
          stride,
          s.out_columns(),
          static_cast<int64_t>(b) * s.T * s.out_columns() + static_cast<int64_t>(h) * hd,
          (static_cast<int64_t>(b) * s.n_head + h) * s.T,
          key_begin == nullptr ? nullptr : key_begin + static_cast<int64_t>(b) * s.T,
          hd};
}

// One (batch, head, query block) of the forward, with an online softmax over the key
// blocks its queries see. q_all and v_all are the head's q and v rows in fp32 ([T, hd]),
// k_t_all its key blocks transposed ([T / kBlock][hd][kBlock]), all built once per
// head (forward_head). Only the queries from write_begin on are written, at row
// i - write_begin of out and lse (a KV cache's step: the earlier rows of the block are
// its past positions, whose results exist already); lse may be null. A query's result
// depends only on its own row, the keys and T, never on the other rows of its block.
template <typename S>
void forward_query_block(typename S::Elem* out, float* lse, const HeadView<S>& hv,
                         const float* q_all, const float* k_t_all, const float* v_all, int i0,
                         int T, int write_begin = 0) {
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
  // Key blocks wholly before every query's first key are skipped.
  const int min_key = hv.min_key(i0, nq);
  for (int j0 = min_key / kBlock * kBlock; j0 <= i0; j0 += kBlock) {
    const int nk = std::min(kBlock, T - j0);
    const float* k_t = k_t_all + static_cast<int64_t>(j0 / kBlock) * hd * kBlock;
    tile_scores(s, q, k_t, nq, hd, j0 == i0);
    for (int ii = 0; ii < nq; ++ii) {
      const int i = i0 + ii;
      const float correction =
          softmax_visible_keys(s + ii * kBlock, hv.first_key(i, j0), visible_keys(i, j0, nk),
                               scale, row_max[ii], row_sum[ii]);
      float* a = acc + ii * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) a[d] *= correction;
    }
    // acc += P V over the block's keys (masked probabilities are zero; keys before
    // every row's first are left out).
    const int skip = std::max(0, min_key - j0);
    const float* v = v_all + static_cast<int64_t>(j0 + skip) * hd;
    tile_gemm(acc, hd, s + skip, kBlock, 1, v, hd, nq, hd, nk - skip);
  }
  for (int ii = std::max(0, write_begin - i0); ii < nq; ++ii) {
    const int64_t row = i0 + ii - write_begin;
    const float inv_sum = 1.0f / row_sum[ii];
    typename S::Elem* out_row = out + hv.out_offset + row * hv.out_stride;
    const float* a = acc + ii * hd;
#pragma omp simd
    for (int d = 0; d < hd; ++d) out_row[d] = S::narrow(a[d] * inv_sum);
    if (lse != nullptr) lse[hv.lse_offset + row] = row_max[ii] + std::log(row_sum[ii]);
  }
}

// One (batch, head) of the forward: its q and v rows (widened) and transposed key blocks
// are built once, where building them per (query block, key block) tile cost ~20%.
template <typename S>
void forward_head(typename S::Elem* out, float* lse, const HeadView<S>& hv, int T) {
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
    forward_query_block<S>(out, lse, hv, q_all, k_t_all, v_all, i0, T);
}

// One query head of a KV cache's step (attention_forward_cached): the cached keys and
// values of positions [0, T) and the new queries [past, T) in fp32 as forward_head
// builds them (the earlier rows of the first query block zero: computed, never
// written), then the query blocks that hold new rows.
template <typename S>
void forward_head_cached(typename S::Elem* out, const HeadView<S>& hv, int64_t q_stride,
                         int past, int T) {
  const int hd = hv.hd;
  const int num_blocks = (T + kBlock - 1) / kBlock;
  const int64_t rows = static_cast<int64_t>(T) * hd;
  float* q_all = head_scratch(2 * rows + static_cast<int64_t>(num_blocks) * hd * kBlock);
  float* v_all = q_all + rows;
  float* k_t_all = v_all + rows;
  const int first_block = past / kBlock * kBlock;
  std::fill(q_all + static_cast<int64_t>(first_block) * hd, q_all + static_cast<int64_t>(past) * hd, 0.0f);
  load_tile<S>(q_all + static_cast<int64_t>(past) * hd, hv.q, q_stride, T - past, hd);
  load_tile<S>(v_all, hv.v, hv.qkv_stride, T, hd);
  for (int block = 0; block < num_blocks; ++block) {
    const int j0 = block * kBlock;
    transpose_block<S>(k_t_all + static_cast<int64_t>(block) * hd * kBlock,
                       hv.k + j0 * hv.qkv_stride, hv.qkv_stride, std::min(kBlock, T - j0), hd);
  }
  for (int i0 = first_block; i0 < T; i0 += kBlock)
    forward_query_block<S>(out, nullptr, hv, q_all, k_t_all, v_all, i0, T, past);
}

// Where a backward task writes the gradient of its head's k and v rows: dqkv itself
// (multi-head attention), or a per-query-head slot that the group's reduction sums.
struct KvGradient {
  float* dk;
  float* dv;
  int64_t stride;
};

// One (batch, head) of the backward. Key blocks outer: a block's dk and dv
// accumulate in scratch over the query blocks that see it and are written once; dq
// accumulates in place. Probabilities are recomputed from the saved log-sum-exp.
template <typename S>
void backward_head(float* dq, const KvGradient& dkv, const float* dout, const typename S::Elem* out,
                   const float* lse, const HeadView<S>& hv, int T) {
  const int hd = hv.hd;
  const int64_t stride = hv.qkv_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
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
  // ([T, hd], copied into dqkv at the end: in place, dq's rows at dqkv's row stride
  // fall into few L1 sets) and D_i = dout_i . out_i, the softmax Jacobian's row term
  // (sum_j p_ij (dout_i . v_j), without the full row of probabilities). out_row is an
  // fp32 copy, so the reduction vectorizes, and sums, the same way for every storage type.
  const int64_t rows = static_cast<int64_t>(T) * hd;
  float* q_all = head_scratch(3 * rows + T);
  float* dout_all = q_all + rows;
  float* dq_rows = dout_all + rows;
  float* D = dq_rows + rows;
  load_tile<S>(q_all, hv.q, stride, T, hd);
  load_tile<Fp32Storage>(dout_all, head_dout, hv.out_stride, T, hd);
  for (int i = 0; i < T; ++i) {
    const float* dout_row = dout_all + static_cast<int64_t>(i) * hd;
    load_tile<S>(out_row, head_out + static_cast<int64_t>(i) * hv.out_stride, hv.out_stride, 1,
                 hd);
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
      // Query blocks that see none of this block's keys are skipped.
      if (hv.min_key(i0, nq) >= j0 + nk) continue;
      const float* dout_rows = dout_all + static_cast<int64_t>(i0) * hd;
      const float* q = q_all + static_cast<int64_t>(i0) * hd;
      tile_scores(p, q, k_t, nq, hd, i0 == j0);
      // dP = dO V^T
      std::fill(ds, ds + nq * kBlock, 0.0f);
      tile_gemm(ds, kBlock, dout_rows, hd, 1, v_t, kBlock, nq, kBlock, hd, i0 == j0);
      for (int ii = 0; ii < nq; ++ii) {
        const int i = i0 + ii;
        const int first = std::min(hv.first_key(i, j0), kBlock);
        const int valid = visible_keys(i, j0, nk);
        const float d_i = D[i];
        const float row_lse = head_lse[i];
        float* p_row = p + ii * kBlock;
        float* ds_row = ds + ii * kBlock;
        const FloatVec scale_v = FloatVec{} + scale, lse_v = FloatVec{} + row_lse,
                       d_v = FloatVec{} + d_i;
        for (int j0 = 0; j0 < kBlock; j0 += kVecLanes) {  // keys outside [first, valid): 0
          const IntVec visible = lanes_within(j0, first, valid);
          const FloatVec pj = exp_vec(load_vec(p_row + j0) * scale_v - lse_v);
          // dS, with the scores' 1/sqrt(hd)
          const FloatVec dsj = pj * (load_vec(ds_row + j0) - d_v) * scale_v;
          store_vec(p_row + j0, visible ? pj : FloatVec{});
          store_vec(ds_row + j0, visible ? dsj : FloatVec{});
        }
      }
      // dV += P^T dO;  dK += dS^T Q;  dQ += dS K.
      tile_gemm(dv_acc, hd, p, 1, kBlock, dout_rows, hd, nk, hd, nq);
      tile_gemm(dk_acc, hd, ds, 1, kBlock, q, hd, nk, hd, nq);
      tile_gemm(dq_rows + static_cast<int64_t>(i0) * hd, hd, ds, kBlock, 1, k, hd, nq, hd, nk);
    }
    for (int j = 0; j < nk; ++j) {
      std::copy(dk_acc + j * hd, dk_acc + (j + 1) * hd, dkv.dk + (j0 + j) * dkv.stride);
      std::copy(dv_acc + j * hd, dv_acc + (j + 1) * hd, dkv.dv + (j0 + j) * dkv.stride);
    }
  }
  for (int i = 0; i < T; ++i)
    std::copy(dq_rows + static_cast<int64_t>(i) * hd, dq_rows + static_cast<int64_t>(i + 1) * hd,
              dq + i * stride);
}

template <typename S>
void forward_all(typename S::Elem* out, float* lse, const typename S::Elem* qkv,
                 const AttentionShape& s, const int32_t* key_begin) {
  const int64_t num_tasks = static_cast<int64_t>(s.B) * s.n_head;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task) {
    const HeadView<S> hv = head_view<S>(qkv, static_cast<int>(task / s.n_head),
                                        static_cast<int>(task % s.n_head), s, key_begin);
    forward_head<S>(out, lse, hv, s.T);
  }
}

// Per-call scratch of the GQA backward: each query head's k and v gradients
// ([B*T, n_head, hd] each), summed per group afterwards. Grows to the largest call
// once, on the calling thread (ranks run as threads may call concurrently).
float* gqa_gradient_scratch(size_t floats) {
  thread_local TrackedBuffer buffer;
  return static_cast<float*>(buffer.grow_to(MemCategory::other, floats * sizeof(float)));
}

template <typename S>
void backward_all(float* dqkv, const float* dout, const typename S::Elem* qkv,
                  const typename S::Elem* out, const float* lse, const AttentionShape& s,
                  const int32_t* key_begin) {
  const int64_t num_tasks = static_cast<int64_t>(s.B) * s.n_head;
  const int hd = s.head_dim;
  const int group = s.group_size();
  const int64_t stride = s.qkv_columns();
  const int64_t N = static_cast<int64_t>(s.B) * s.T;
  // Multi-head attention writes dk, dv in place; GQA a slot per query head.
  float* slots = group == 1 ? nullptr
                            : gqa_gradient_scratch(2 * static_cast<size_t>(N) * s.out_columns());
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int b = static_cast<int>(task / s.n_head), h = static_cast<int>(task % s.n_head);
      const HeadView<S> hv = head_view<S>(qkv, b, h, s, key_begin);
      float* dq = dqkv + (hv.q - qkv);
      KvGradient dkv{dqkv + (hv.k - qkv), dqkv + (hv.v - qkv), stride};
      if (slots != nullptr) {
        float* dk_slot = slots + static_cast<int64_t>(b) * s.T * s.out_columns() +
                         static_cast<int64_t>(h) * hd;
        dkv = {dk_slot, dk_slot + N * s.out_columns(), s.out_columns()};
      }
      backward_head<S>(dq, dkv, dout, out, lse, hv, s.T);
    }
    // GQA: dk, dv of kv head g = the sum of its query heads' slots, in head order.
    if (slots != nullptr) {
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n)
        for (int which = 0; which < 2; ++which) {  // k, then v
          const float* slot_row = slots + (which * N + n) * s.out_columns();
          float* grad_row =
              dqkv + n * stride + static_cast<int64_t>(s.n_head + which * s.n_kv_head) * hd;
          for (int g = 0; g < s.n_kv_head; ++g) {
            const float* first = slot_row + static_cast<int64_t>(g) * group * hd;
            float* dst = grad_row + static_cast<int64_t>(g) * hd;
            std::copy(first, first + hd, dst);
            for (int r = 1; r < group; ++r) {
              const float* add = first + static_cast<int64_t>(r) * hd;
#pragma omp simd
              for (int d = 0; d < hd; ++d) dst[d] += add[d];
            }
          }
        }
    }
  }
}

// The bf16 dot-product kernels (attention_bf16.cpp) handle multi-head attention without
// key_begin and an even head_dim: GPT-2's case, which they keep exactly. GQA and packed
// documents take the widening fp32 path everywhere; the dot-product kernels are not
// extended to them because no CPU with avx512_bf16 was at hand to test such code on.
bool bf16_dot_products_handle(const AttentionShape& s, bool has_key_begin) {
  return s.n_kv_head == s.n_head && !has_key_begin && s.head_dim % 2 == 0;
}

// Whether a bf16 attention call takes the dot-product kernels.
bool use_bf16_dot_products(Bf16AttentionPath path, DType dtype, const AttentionShape& s,
                           bool has_key_begin) {
  if (dtype != DType::bf16 || path == Bf16AttentionPath::kWidenToFp32) return false;
  const bool available = attention_uses_bf16_dot_products(s, has_key_begin);
  SHARDLM_CHECK(available || path == Bf16AttentionPath::kAuto,
                "attention: bf16 dot products need avx512_bf16 (this CPU: {}), an even head_dim "
                "(got {}), n_kv_head == n_head (got {} and {}) and no key_begin (got {})",
                bf16_dot_products_available() ? "yes" : "no", s.head_dim, s.n_kv_head, s.n_head,
                has_key_begin ? "one" : "none");
  return available;
}

void check_call(const AttentionShape& s, DType out_type, DType qkv_type,
                const int32_t* key_begin) {
  check_shape(s);
  SHARDLM_CHECK(out_type == qkv_type, "attention: output is {} but qkv is {}; expected one type",
                dtype_name(out_type), dtype_name(qkv_type));
  check_key_begin(key_begin, s);
}

}  // namespace

bool attention_uses_bf16_dot_products(const AttentionShape& s, bool has_key_begin) {
  return bf16_dot_products_handle(s, has_key_begin) && bf16_dot_products_available();
}

void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, const AttentionShape& s,
                       const int32_t* key_begin) {
  attention_forward_on(Bf16AttentionPath::kAuto, out, lse, qkv, s, key_begin);
}

void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                        const float* lse, const AttentionShape& s, const int32_t* key_begin) {
  attention_backward_on(Bf16AttentionPath::kAuto, dqkv, dout, qkv, out, lse, s, key_begin);
}

void attention_forward_on(Bf16AttentionPath path, TypedPtr out, float* lse, ConstTypedPtr qkv,
                          const AttentionShape& s, const int32_t* key_begin) {
  const PhaseScope phase(Phase::attention);
  check_call(s, out.dtype, qkv.dtype, key_begin);
  if (use_bf16_dot_products(path, qkv.dtype, s, key_begin != nullptr)) {
    attention_forward_bf16_dot(static_cast<uint16_t*>(out.data), lse,
                               static_cast<const uint16_t*>(qkv.data), s.B, s.T,
                               s.n_head * s.head_dim, s.n_head);
    return;
  }
  with_storage(qkv.dtype, [&](auto storage) {
    using S = decltype(storage);
    forward_all<S>(static_cast<typename S::Elem*>(out.data), lse,
                   static_cast<const typename S::Elem*>(qkv.data), s, key_begin);
  });
}

void attention_forward_cached(TypedPtr out, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr k,
                              ConstTypedPtr v, int64_t ld_kv, const AttentionShape& s, int past) {
  const PhaseScope phase(Phase::attention);
  check_shape(s);
  SHARDLM_CHECK(s.B == 1, "attention over a KV cache: one sequence at a time, got batch {}", s.B);
  SHARDLM_CHECK(past >= 0, "attention over a KV cache: past length {} must be >= 0", past);
  SHARDLM_CHECK(out.dtype == q.dtype && q.dtype == k.dtype && k.dtype == v.dtype,
                "attention over a KV cache: out, q, k and v must share one type, got {} {} {} {}",
                dtype_name(out.dtype), dtype_name(q.dtype), dtype_name(k.dtype),
                dtype_name(v.dtype));
  SHARDLM_CHECK(ld_q >= s.out_columns() && ld_kv >= static_cast<int64_t>(s.n_kv_head) * s.head_dim,
                "attention over a KV cache: row strides {} (q) and {} (k, v) are shorter than "
                "the rows {} and {}", ld_q, ld_kv, s.out_columns(),
                static_cast<int64_t>(s.n_kv_head) * s.head_dim);
  const int T = past + s.T;
  with_storage(q.dtype, [&](auto storage) {
    using S = decltype(storage);
    using E = typename S::Elem;
    const E* q_base = static_cast<const E*>(q.data);
    const E* k_base = static_cast<const E*>(k.data);
    const E* v_base = static_cast<const E*>(v.data);
#pragma omp parallel for schedule(dynamic, 1)
    for (int h = 0; h < s.n_head; ++h) {
      const int kv = h / s.group_size();
      const HeadView<S> hv{q_base + static_cast<int64_t>(h) * s.head_dim,
                           k_base + static_cast<int64_t>(kv) * s.head_dim,
                           v_base + static_cast<int64_t>(kv) * s.head_dim,
                           ld_kv,
                           s.out_columns(),
                           static_cast<int64_t>(h) * s.head_dim,
                           0,
                           nullptr,
                           s.head_dim};
      forward_head_cached<S>(static_cast<E*>(out.data), hv, ld_q, past, T);
    }
  });
}

void attention_backward_on(Bf16AttentionPath path, float* dqkv, const float* dout,
                           ConstTypedPtr qkv, ConstTypedPtr out, const float* lse,
                           const AttentionShape& s, const int32_t* key_begin) {
  const PhaseScope phase(Phase::attention);
  check_call(s, out.dtype, qkv.dtype, key_begin);
  if (use_bf16_dot_products(path, qkv.dtype, s, key_begin != nullptr)) {
    attention_backward_bf16_dot(dqkv, dout, static_cast<const uint16_t*>(qkv.data),
                                static_cast<const uint16_t*>(out.data), lse, s.B, s.T,
                                s.n_head * s.head_dim, s.n_head);
    return;
  }
  with_storage(qkv.dtype, [&](auto storage) {
    using S = decltype(storage);
    backward_all<S>(dqkv, dout, static_cast<const typename S::Elem*>(qkv.data),
                    static_cast<const typename S::Elem*>(out.data), lse, s, key_begin);
  });
}

}  // namespace shardlm::cpu
