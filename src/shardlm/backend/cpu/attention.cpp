#include "shardlm/backend/cpu/attention.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm::cpu {

namespace {

constexpr int kBlockK = 64;  // keys per block, transposed into scratch
constexpr int kBlockQ = 64;  // queries per forward task

// dst[d * kBlockK + j] = src[j * src_stride + d] for j < rows; zero for the rest of
// the block, so full-width dot products below stay well defined.
void transpose_block(float* dst, const float* src, int64_t src_stride, int rows, int hd) {
  for (int d = 0; d < hd; ++d) {
    float* dst_row = dst + d * kBlockK;
    for (int j = 0; j < rows; ++j) dst_row[j] = src[j * src_stride + d];
    for (int j = rows; j < kBlockK; ++j) dst_row[j] = 0.0f;
  }
}

// out[j] = sum_d x[d] * block_t[d][j] for all kBlockK columns: one query (or output
// gradient) row against a transposed key (or value) block.
inline void row_times_block(float* out, const float* x, const float* block_t, int hd) {
  alignas(64) float acc[kBlockK] = {};
  for (int d = 0; d < hd; ++d) {
    const float xd = x[d];
    const float* block_row = block_t + d * kBlockK;
#pragma omp simd aligned(acc : 64)
    for (int j = 0; j < kBlockK; ++j) acc[j] += xd * block_row[j];
  }
  std::copy(acc, acc + kBlockK, out);
}

void check_shape(int T, int C, int H) {
  SHARDLM_CHECK(H > 0 && C % H == 0, "attention: n_embd {} is not divisible by n_head {}", C, H);
  SHARDLM_CHECK(C / H <= kAttentionMaxHeadDim, "attention: head_dim {} exceeds the supported {}",
                C / H, kAttentionMaxHeadDim);
  SHARDLM_CHECK(T > 0, "attention: sequence length must be positive, got {}", T);
}

// One (batch, head, query block) of the forward.
void forward_query_block(float* out, float* lse, const float* qkv, int b, int h, int i0, int T,
                         int C, int H) {
  const int hd = C / H;
  const int64_t stride = 3 * static_cast<int64_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* q = qkv + static_cast<int64_t>(b) * T * stride + h * hd;
  const float* k = q + C;
  const float* v = q + 2 * C;
  const int nq = std::min(kBlockQ, T - i0);

  alignas(64) float k_t[kAttentionMaxHeadDim * kBlockK];
  alignas(64) float acc[kBlockQ * kAttentionMaxHeadDim];
  alignas(64) float p[kBlockK];
  float row_max[kBlockQ];
  float row_sum[kBlockQ];
  std::fill(acc, acc + nq * hd, 0.0f);
  std::fill(row_max, row_max + nq, -INFINITY);
  std::fill(row_sum, row_sum + nq, 0.0f);

  const int key_end = i0 + nq;  // causal: no query in this block sees keys >= key_end
  for (int j0 = 0; j0 < key_end; j0 += kBlockK) {
    const int nk = std::min(kBlockK, key_end - j0);
    transpose_block(k_t, k + j0 * stride, stride, nk, hd);
    for (int ii = 0; ii < nq; ++ii) {
      const int i = i0 + ii;
      const int valid = std::min(nk, i - j0 + 1);
      if (valid <= 0) continue;
      row_times_block(p, q + i * stride, k_t, hd);
      float block_max = -INFINITY;
      for (int j = 0; j < valid; ++j) {
        p[j] *= scale;
        block_max = std::max(block_max, p[j]);
      }
      const float new_max = std::max(row_max[ii], block_max);
      const float correction = exp_approx(row_max[ii] - new_max);
      float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
      for (int j = 0; j < valid; ++j) {
        p[j] = exp_approx(p[j] - new_max);
        block_sum += p[j];
      }
      row_sum[ii] = row_sum[ii] * correction + block_sum;
      row_max[ii] = new_max;
      float* a = acc + ii * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) a[d] *= correction;
      for (int j = 0; j < valid; ++j) {
        const float pj = p[j];
        const float* v_row = v + (j0 + j) * stride;
#pragma omp simd
        for (int d = 0; d < hd; ++d) a[d] += pj * v_row[d];
      }
    }
  }
  for (int ii = 0; ii < nq; ++ii) {
    const int i = i0 + ii;
    const float inv_sum = 1.0f / row_sum[ii];
    float* out_row = out + (static_cast<int64_t>(b) * T + i) * C + h * hd;
    const float* a = acc + ii * hd;
#pragma omp simd
    for (int d = 0; d < hd; ++d) out_row[d] = a[d] * inv_sum;
    lse[(static_cast<int64_t>(b) * H + h) * T + i] = row_max[ii] + std::log(row_sum[ii]);
  }
}

// One (batch, head) of the backward: key blocks outer, so dk and dv of a block are
// accumulated in scratch and written once; dq accumulates in place.
void backward_head(float* dqkv, const float* dout, const float* qkv, const float* out,
                   const float* lse, int b, int h, int T, int C, int H) {
  const int hd = C / H;
  const int64_t stride = 3 * static_cast<int64_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t batch_offset = static_cast<int64_t>(b) * T;
  const float* q = qkv + batch_offset * stride + h * hd;
  const float* k = q + C;
  const float* v = q + 2 * C;
  float* dq = dqkv + batch_offset * stride + h * hd;
  float* dk = dq + C;
  float* dv = dq + 2 * C;
  const float* head_lse = lse + (static_cast<int64_t>(b) * H + h) * T;
  const float* head_dout = dout + batch_offset * C + h * hd;
  const float* head_out = out + batch_offset * C + h * hd;

  alignas(64) float k_t[kAttentionMaxHeadDim * kBlockK];
  alignas(64) float v_t[kAttentionMaxHeadDim * kBlockK];
  alignas(64) float dk_acc[kBlockK * kAttentionMaxHeadDim];
  alignas(64) float dv_acc[kBlockK * kAttentionMaxHeadDim];
  alignas(64) float p[kBlockK];
  alignas(64) float dp[kBlockK];

  for (int i = 0; i < T; ++i) std::fill(dq + i * stride, dq + i * stride + hd, 0.0f);

  for (int j0 = 0; j0 < T; j0 += kBlockK) {
    const int nk = std::min(kBlockK, T - j0);
    transpose_block(k_t, k + j0 * stride, stride, nk, hd);
    transpose_block(v_t, v + j0 * stride, stride, nk, hd);
    std::fill(dk_acc, dk_acc + nk * hd, 0.0f);
    std::fill(dv_acc, dv_acc + nk * hd, 0.0f);
    for (int i = j0; i < T; ++i) {
      const int valid = std::min(nk, i - j0 + 1);
      const float* q_row = q + i * stride;
      const float* dout_row = head_dout + static_cast<int64_t>(i) * C;
      const float* out_row = head_out + static_cast<int64_t>(i) * C;
      row_times_block(p, q_row, k_t, hd);
      row_times_block(dp, dout_row, v_t, hd);
      // D_i = dout_i . out_i = sum_j p_ij (dout_i . v_j): the softmax Jacobian's
      // row term, without materializing the row.
      float d_i = 0.0f;
#pragma omp simd reduction(+ : d_i)
      for (int d = 0; d < hd; ++d) d_i += dout_row[d] * out_row[d];
      const float row_lse = head_lse[i];
#pragma omp simd
      for (int j = 0; j < valid; ++j) {
        const float pj = exp_approx(p[j] * scale - row_lse);
        p[j] = pj;
        dp[j] = pj * (dp[j] - d_i) * scale;  // dS, with the 1/sqrt(hd) of the scores
      }
      float* dq_row = dq + i * stride;
      for (int j = 0; j < valid; ++j) {
        const float pj = p[j];
        const float dsj = dp[j];
        const float* k_row = k + (j0 + j) * stride;
        float* dv_row = dv_acc + j * hd;
        float* dk_row = dk_acc + j * hd;
#pragma omp simd
        for (int d = 0; d < hd; ++d) {
          dv_row[d] += pj * dout_row[d];
          dk_row[d] += dsj * q_row[d];
          dq_row[d] += dsj * k_row[d];
        }
      }
    }
    for (int j = 0; j < nk; ++j) {
      std::copy(dk_acc + j * hd, dk_acc + (j + 1) * hd, dk + (j0 + j) * stride);
      std::copy(dv_acc + j * hd, dv_acc + (j + 1) * hd, dv + (j0 + j) * stride);
    }
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int H) {
  check_shape(T, C, H);
  const int num_query_blocks = (T + kBlockQ - 1) / kBlockQ;
  const int64_t num_tasks = static_cast<int64_t>(B) * H * num_query_blocks;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task) {
    // Last query blocks first: they see the most keys, so dynamic scheduling
    // balances better when they start early.
    const int query_block = num_query_blocks - 1 - static_cast<int>(task % num_query_blocks);
    const int64_t bh = task / num_query_blocks;
    forward_query_block(out, lse, qkv, static_cast<int>(bh / H), static_cast<int>(bh % H),
                        query_block * kBlockQ, T, C, H);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int H) {
  check_shape(T, C, H);
  const int64_t num_tasks = static_cast<int64_t>(B) * H;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task)
    backward_head(dqkv, dout, qkv, out, lse, static_cast<int>(task / H), static_cast<int>(task % H),
                  T, C, H);
}

}  // namespace shardlm::cpu
