#include "shardlm/backend/cpu/attention_block.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

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

// Reads one value of a compute-type array as fp32.
struct Reader {
  const void* base;
  DType dtype;
  float operator()(int64_t i) const {
    switch (dtype) {
      case DType::fp32: return static_cast<const float*>(base)[i];
      case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
      case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    }
    return 0.0f;
  }
};

// rows x hd values of `src` (row r at element offset + r * ld) into the fp32 `dst`.
void load_rows(float* dst, const Reader& src, int64_t offset, int64_t ld, int rows, int hd) {
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < hd; ++d) dst[static_cast<int64_t>(r) * hd + d] = src(offset + r * ld + d);
}

float* block_scratch(size_t floats) {
  thread_local TrackedBuffer buffer;
  return static_cast<float*>(buffer.grow_to(MemCategory::other, floats * sizeof(float)));
}

inline float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

}  // namespace

void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q,
                             ConstTypedPtr kv, const AttentionBlockShape& s,
                             const int32_t* key_range) {
  const PhaseScope phase(Phase::attention);
  check_block(s, q.dtype, kv.dtype, key_range);
  const int hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t ld_kv = s.kv_columns(), ld_out = s.q_columns();
  const Reader q_read{q.data, q.dtype}, kv_read{kv.data, kv.dtype};
  const int64_t tasks = static_cast<int64_t>(s.B) * s.n_head;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int b = static_cast<int>(task / s.n_head), h = static_cast<int>(task % s.n_head);
    const int g = h / s.group_size();
    const int64_t kv_rows = static_cast<int64_t>(s.kv_len) * hd;
    float* k = block_scratch(2 * static_cast<size_t>(kv_rows) + static_cast<size_t>(s.kv_len) +
                             static_cast<size_t>(hd));
    float* v = k + kv_rows;
    float* scores = v + kv_rows;
    float* q_row = scores + s.kv_len;
    const int64_t kv_row0 = static_cast<int64_t>(b) * s.kv_len * ld_kv;
    load_rows(k, kv_read, kv_row0 + static_cast<int64_t>(g) * hd, ld_kv, s.kv_len, hd);
    load_rows(v, kv_read, kv_row0 + static_cast<int64_t>(s.n_kv_head + g) * hd, ld_kv, s.kv_len,
              hd);
    for (int i = 0; i < s.q_len; ++i) {
      const int64_t query = static_cast<int64_t>(b) * s.q_len + i;
      const int first = key_range[2 * query], end = key_range[2 * query + 1];
      float* o = out + query * ld_out + static_cast<int64_t>(h) * hd;
      float& row_lse = lse[(static_cast<int64_t>(b) * s.n_head + h) * s.q_len + i];
      std::fill(o, o + hd, 0.0f);
      if (first >= end) {
        row_lse = -INFINITY;
        continue;
      }
      load_rows(q_row, q_read, query * ld_q + static_cast<int64_t>(h) * hd, ld_q, 1, hd);
      float max = -INFINITY;
      for (int j = first; j < end; ++j) {
        scores[j] = dot(q_row, k + static_cast<int64_t>(j) * hd, hd) * scale;
        max = std::max(max, scores[j]);
      }
      float sum = 0.0f;
      for (int j = first; j < end; ++j) {
        const float p = std::exp(scores[j] - max);
        sum += p;
        const float* vj = v + static_cast<int64_t>(j) * hd;
#pragma omp simd
        for (int d = 0; d < hd; ++d) o[d] += p * vj[d];
      }
      const float inv = 1.0f / sum;
      for (int d = 0; d < hd; ++d) o[d] *= inv;
      row_lse = max + std::log(sum);
    }
  }
}

void attention_block_backward(float* dq, float* dkv, const float* dout, ConstTypedPtr out,
                              const float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                              const AttentionBlockShape& s, const int32_t* key_range) {
  const PhaseScope phase(Phase::attention);
  check_block(s, q.dtype, kv.dtype, key_range);
  SHARDLM_CHECK(out.dtype == q.dtype, "attention block: out is {} but q is {}; expected one type",
                dtype_name(out.dtype), dtype_name(q.dtype));
  const int hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t ld_kv = s.kv_columns(), ld_out = s.q_columns();
  const Reader q_read{q.data, q.dtype}, kv_read{kv.data, kv.dtype}, out_read{out.data, out.dtype};
  // A task per (batch row, kv head): it owns that head's key gradients, summed over its
  // query heads in order.
  const int64_t tasks = static_cast<int64_t>(s.B) * s.n_kv_head;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int b = static_cast<int>(task / s.n_kv_head), g = static_cast<int>(task % s.n_kv_head);
    const int64_t kv_rows = static_cast<int64_t>(s.kv_len) * hd;
    float* k = block_scratch(4 * static_cast<size_t>(kv_rows) + 4 * static_cast<size_t>(hd));
    float* v = k + kv_rows;
    float* dk = v + kv_rows;
    float* dv = dk + kv_rows;
    float* q_row = dv + kv_rows;
    float* do_row = q_row + hd;
    float* o_row = do_row + hd;
    float* dq_row = o_row + hd;
    const int64_t kv_row0 = static_cast<int64_t>(b) * s.kv_len * ld_kv;
    load_rows(k, kv_read, kv_row0 + static_cast<int64_t>(g) * hd, ld_kv, s.kv_len, hd);
    load_rows(v, kv_read, kv_row0 + static_cast<int64_t>(s.n_kv_head + g) * hd, ld_kv, s.kv_len,
              hd);
    std::fill(dk, dk + 2 * kv_rows, 0.0f);
    for (int h = g * s.group_size(); h < (g + 1) * s.group_size(); ++h)
      for (int i = 0; i < s.q_len; ++i) {
        const int64_t query = static_cast<int64_t>(b) * s.q_len + i;
        const int first = key_range[2 * query], end = key_range[2 * query + 1];
        if (first >= end) continue;
        const int64_t head_col = static_cast<int64_t>(h) * hd;
        load_rows(q_row, q_read, query * ld_q + head_col, ld_q, 1, hd);
        load_rows(o_row, out_read, query * ld_out + head_col, ld_out, 1, hd);
        std::copy(dout + query * ld_out + head_col, dout + query * ld_out + head_col + hd, do_row);
        // D_i = dout_i . out_i, the softmax Jacobian's row term.
        const float D = dot(do_row, o_row, hd);
        const float row_lse = lse[(static_cast<int64_t>(b) * s.n_head + h) * s.q_len + i];
        std::fill(dq_row, dq_row + hd, 0.0f);
        for (int j = first; j < end; ++j) {
          const float* kj = k + static_cast<int64_t>(j) * hd;
          const float* vj = v + static_cast<int64_t>(j) * hd;
          const float p = std::exp(dot(q_row, kj, hd) * scale - row_lse);
          const float ds = p * (dot(do_row, vj, hd) - D) * scale;
          float* dkj = dk + static_cast<int64_t>(j) * hd;
          float* dvj = dv + static_cast<int64_t>(j) * hd;
#pragma omp simd
          for (int d = 0; d < hd; ++d) {
            dq_row[d] += ds * kj[d];
            dkj[d] += ds * q_row[d];
            dvj[d] += p * do_row[d];
          }
        }
        float* dq_out = dq + query * ld_out + head_col;
        for (int d = 0; d < hd; ++d) dq_out[d] += dq_row[d];
      }
    for (int j = 0; j < s.kv_len; ++j) {
      float* row = dkv + (static_cast<int64_t>(b) * s.kv_len + j) * ld_kv;
      float* dk_out = row + static_cast<int64_t>(g) * hd;
      float* dv_out = row + static_cast<int64_t>(s.n_kv_head + g) * hd;
      for (int d = 0; d < hd; ++d) {
        dk_out[d] += dk[static_cast<int64_t>(j) * hd + d];
        dv_out[d] += dv[static_cast<int64_t>(j) * hd + d];
      }
    }
  }
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
