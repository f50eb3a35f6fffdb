#include "shardlm/backend/cpu/moe.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "shardlm/core/error.hpp"

namespace shardlm::cpu {

void gather_rows(TypedPtr dst, ConstTypedPtr src, const int32_t* index, int64_t rows,
                 int64_t width) {
  SHARDLM_CHECK(dst.dtype == src.dtype, "gather_rows: {} rows into {} (one storage type)",
                dtype_name(src.dtype), dtype_name(dst.dtype));
  const size_t row_bytes = dtype_bytes(src.dtype) * static_cast<size_t>(width);
  auto* out = static_cast<char*>(dst.data);
  const auto* in = static_cast<const char*>(src.data);
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(out + static_cast<size_t>(i) * row_bytes,
                in + static_cast<size_t>(index[i]) * row_bytes, row_bytes);
}

void scatter_add_rows(float* out, const float* src, const int32_t* index, const float* weight,
                      int64_t rows, int64_t width) {
  for (int64_t i = 0; i < rows; ++i) {
    float* y = out + static_cast<int64_t>(index[i]) * width;
    const float* o = src + i * width;
    if (weight == nullptr) {
      for (int64_t j = 0; j < width; ++j) y[j] += o[j];
    } else {
      const float w = weight[i];
      for (int64_t j = 0; j < width; ++j) y[j] += w * o[j];
    }
  }
}

void moe_assignment_weights(float* weight, const float* top_weight, const int32_t* token,
                            const int32_t* slot, int k, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i)
    weight[i] = top_weight[static_cast<int64_t>(token[i]) * k + slot[i]];
}

void moe_scatter_weight_grads(float* d_top_weight, const float* dot, const int32_t* token,
                              const int32_t* slot, int k, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i)
    d_top_weight[static_cast<int64_t>(token[i]) * k + slot[i]] += dot[i];
}

void moe_weight_backward(float* dot, float* g, const float* act, int64_t I, float* dy, int64_t C,
                         const float* weight, int64_t rows) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    float d = 0;
    for (int64_t j = 0; j < I; ++j) d += g[i * I + j] * act[i * I + j];
    dot[i] = d;
    const float w = weight[i];
    for (int64_t j = 0; j < I; ++j) g[i * I + j] *= w;
    for (int64_t j = 0; j < C; ++j) dy[i * C + j] *= w;
  }
}

void moe_router_backward(float* dlogits, const float* probs, const int32_t* top_expert,
                         const float* d_top_weight, const float* aux_dprob, int64_t n, int E,
                         int k, bool norm_topk_prob) {
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;
    const int32_t* top = top_expert + t * k;
    const float* dw = d_top_weight + t * k;
    for (int e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = aux_dprob != nullptr ? aux_dprob[e] : 0.0f;
    if (norm_topk_prob) {
      // w_j = p_j / S: dp_m += dw_m / S - (sum_j dw_j p_j) / S^2.
      float S = 0, dot = 0;
      for (int j = 0; j < k; ++j) {
        S += p[top[j]];
        dot += dw[j] * p[top[j]];
      }
      for (int j = 0; j < k; ++j) dp[static_cast<size_t>(top[j])] += dw[j] / S - dot / (S * S);
    } else {
      for (int j = 0; j < k; ++j) dp[static_cast<size_t>(top[j])] += dw[j];
    }
    // Softmax: dz_e = p_e (dp_e - sum_f p_f dp_f).
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[static_cast<size_t>(e)];
    float* dz = dlogits + t * E;
    for (int e = 0; e < E; ++e) dz[e] = p[e] * (dp[static_cast<size_t>(e)] - dot);
  }
}

void shared_expert_gate_forward(float* gate, float* y, const float* out, int64_t n, int64_t C) {
  for (int64_t t = 0; t < n; ++t) gate[t] = 1.0f / (1.0f + std::exp(-gate[t]));
  if (y == nullptr) return;
  for (int64_t t = 0; t < n; ++t) {
    const float g = gate[t];
    const float* s = out + t * C;
    float* yt = y + t * C;
    for (int64_t j = 0; j < C; ++j) yt[j] += g * s[j];
  }
}

void shared_expert_gate_backward(float* dz, float* ds, const float* dy, const float* gate,
                                 const float* out, int64_t n, int64_t C) {
  for (int64_t t = 0; t < n; ++t) {
    const float g = gate[t];
    const float* d = dy + t * C;
    const float* s = out + t * C;
    float dot = 0.0f;
    for (int64_t j = 0; j < C; ++j) dot += d[j] * s[j];
    dz[t] = dot * g * (1.0f - g);
    float* dst = ds + t * C;
    for (int64_t j = 0; j < C; ++j) dst[j] = g * d[j];
  }
}

}  // namespace shardlm::cpu
