// Naive causal self-attention in double, the reference the attention kernels are
// tested against: qkv rows [B, T, 3C] (q, k, v of head h at columns group * C + h * hd),
// output rows [B, T, C], full score rows, no blocking, no online softmax.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace naive_attention {

struct AttentionShape {
  int B, T, H, hd;
};

// qkv element d of head h, `group` 0/1/2 = q/k/v, at batch b and position t.
inline size_t qkv_index(const AttentionShape& s, int b, int t, int group, int h, int d) {
  const size_t C = static_cast<size_t>(s.H) * s.hd;
  return (static_cast<size_t>(b) * s.T + t) * 3 * C + group * C + static_cast<size_t>(h) * s.hd + d;
}

// Output (and dout) element d of head h at batch b and position t.
inline size_t out_index(const AttentionShape& s, int b, int t, int h, int d) {
  const size_t C = static_cast<size_t>(s.H) * s.hd;
  return (static_cast<size_t>(b) * s.T + t) * C + static_cast<size_t>(h) * s.hd + d;
}

// Query row i of head h: p[j] = softmax_j(q_i . k_j / sqrt(hd)) for j <= i (p is
// resized to i + 1). Returns the row's log-sum-exp of the scaled scores.
template <typename Values>
double softmax_row(const Values& qkv, const AttentionShape& s, int b, int h, int i,
                   std::vector<double>& p) {
  const double scale = 1.0 / std::sqrt(double(s.hd));
  p.assign(static_cast<size_t>(i) + 1, 0.0);
  double mx = -1e300;
  for (int j = 0; j <= i; ++j) {
    double score = 0.0;
    for (int d = 0; d < s.hd; ++d)
      score += double(qkv[qkv_index(s, b, i, 0, h, d)]) * double(qkv[qkv_index(s, b, j, 1, h, d)]);
    p[j] = score * scale;
    mx = std::max(mx, p[j]);
  }
  double sum = 0.0;
  for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (double& x : p) x /= sum;
  return mx + std::log(sum);
}

// out [B, T, C] = softmax(q k^T / sqrt(hd), causal) v; lse [B, H, T] if given.
template <typename Values>
std::vector<double> forward(const Values& qkv, const AttentionShape& s,
                            std::vector<double>* lse = nullptr) {
  std::vector<double> out(static_cast<size_t>(s.B) * s.T * s.H * s.hd, 0.0);
  std::vector<double> p;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.T; ++i) {
        const double row_lse = softmax_row(qkv, s, b, h, i, p);
        for (int d = 0; d < s.hd; ++d) {
          double acc = 0.0;
          for (int j = 0; j <= i; ++j) acc += p[j] * double(qkv[qkv_index(s, b, j, 2, h, d)]);
          out[out_index(s, b, i, h, d)] = acc;
        }
        if (lse != nullptr) (*lse)[(static_cast<size_t>(b) * s.H + h) * s.T + i] = row_lse;
      }
  return out;
}

}  // namespace naive_attention
