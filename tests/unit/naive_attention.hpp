// Naive causal self-attention in double, the reference the attention kernels are
// tested against: full score rows, no blocking, no online softmax.
//   qkv rows [B*T, (H + 2 KV) hd]: q head h at columns h hd, k head g at (H + g) hd,
//   v head g at (H + KV + g) hd; query head h reads kv head h / (H / KV). KV = 0 means
//   KV = H (multi-head attention: q, k, v of head h at group * C + h hd).
//   out rows [B*T, H hd]; lse [B, H, T].
//   key_begin: null, or [B*T]: query t of batch row b sees keys [key_begin[b T + t], t].
//
// reference() also returns, per output element, a bound on the error of the fp32
// kernels (attention.cpp) on the same inputs; see the comment above it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace naive_attention {

struct AttentionShape {
  int B, T, H, hd;
  int KV = 0;  // key/value heads; 0: H

  int kv_heads() const { return KV == 0 ? H : KV; }
  int kv_of(int h) const { return h / (H / kv_heads()); }
  size_t qkv_columns() const { return static_cast<size_t>(H + 2 * kv_heads()) * hd; }
  size_t out_columns() const { return static_cast<size_t>(H) * hd; }
  size_t qkv_size() const { return static_cast<size_t>(B) * T * qkv_columns(); }
  size_t out_size() const { return static_cast<size_t>(B) * T * out_columns(); }
  size_t lse_size() const { return static_cast<size_t>(B) * H * T; }
};

// qkv element d of `group` 0/1/2 = q/k/v at batch b and position t: head `head` is a
// query head for q, a kv head for k and v.
inline size_t qkv_index(const AttentionShape& s, int b, int t, int group, int head, int d) {
  const size_t column_head =
      group == 0 ? head : group == 1 ? s.H + head : s.H + s.kv_heads() + head;
  return (static_cast<size_t>(b) * s.T + t) * s.qkv_columns() + column_head * s.hd + d;
}

// Output (and dout) element d of query head h at batch b and position t.
inline size_t out_index(const AttentionShape& s, int b, int t, int h, int d) {
  return (static_cast<size_t>(b) * s.T + t) * s.out_columns() + static_cast<size_t>(h) * s.hd + d;
}

inline size_t lse_index(const AttentionShape& s, int b, int h, int t) {
  return (static_cast<size_t>(b) * s.H + h) * s.T + t;
}

// The first key query i of batch row b sees.
inline int first_key(const int32_t* key_begin, const AttentionShape& s, int b, int i) {
  return key_begin == nullptr ? 0 : key_begin[static_cast<size_t>(b) * s.T + i];
}

// Query row i of query head h: p[j] = softmax_j(q_i . k_j / sqrt(hd)) over the visible
// keys j, 0 for the others (p is resized to i + 1). Returns the row's log-sum-exp of
// the scaled scores.
template <typename Values>
double softmax_row(const Values& qkv, const AttentionShape& s, int b, int h, int i,
                   std::vector<double>& p, const int32_t* key_begin = nullptr) {
  const double scale = 1.0 / std::sqrt(double(s.hd));
  const int g = s.kv_of(h), j0 = first_key(key_begin, s, b, i);
  p.assign(static_cast<size_t>(i) + 1, 0.0);
  double mx = -1e300;
  for (int j = j0; j <= i; ++j) {
    double score = 0.0;
    for (int d = 0; d < s.hd; ++d)
      score += double(qkv[qkv_index(s, b, i, 0, h, d)]) * double(qkv[qkv_index(s, b, j, 1, g, d)]);
    p[j] = score * scale;
    mx = std::max(mx, p[j]);
  }
  double sum = 0.0;
  for (int j = j0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (int j = j0; j <= i; ++j) p[j] /= sum;
  return mx + std::log(sum);
}

// out [B*T, H hd] = softmax(q k^T / sqrt(hd), causal [, documents]) v; lse if given.
template <typename Values>
std::vector<double> forward(const Values& qkv, const AttentionShape& s,
                            std::vector<double>* lse = nullptr,
                            const int32_t* key_begin = nullptr) {
  std::vector<double> out(s.out_size(), 0.0);
  std::vector<double> p;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.T; ++i) {
        const double row_lse = softmax_row(qkv, s, b, h, i, p, key_begin);
        for (int d = 0; d < s.hd; ++d) {
          double acc = 0.0;
          for (int j = 0; j <= i; ++j)
            acc += p[j] * double(qkv[qkv_index(s, b, j, 2, s.kv_of(h), d)]);
          out[out_index(s, b, i, h, d)] = acc;
        }
        if (lse != nullptr) (*lse)[lse_index(s, b, h, i)] = row_lse;
      }
  return out;
}

// Results of the naive double forward and backward, and a bound on each element's
// error in the fp32 kernels.
struct Reference {
  std::vector<double> out, out_bound, lse, lse_bound, dqkv, dqkv_bound;
};

// The bound, element by element, from the kernels' fp32 operations (u = 2^-24; a sum
// of n terms rounded in sequence is off by at most lambda sqrt(n) u sum |terms| except
// with negligible probability: Higham & Mary's probabilistic bound, lambda = 6 here; the
// deterministic worst case n u is far too pessimistic for the sums here). With
// e_ij = the error of query i's scaled score against key j plus exp's:
//   e_ij = lambda sqrt(hd) u scale sum_d |q_id k_jd|       (the score's dot product)
//        + 2u (|s_ij| + |s_ij - m_i|)                      (scaling; subtracting the max)
//        + 5u                                              (exp_approx: < 3e-7 relative)
// forward, over the n visible keys and nb key blocks of row i (p exact probabilities):
//   |d out_id| <= sum_j p_ij |v_jd| (e_ij + r_i) + |out_id| (sum_j p_ij e_ij + r_i + 2u),
//   r_i = lambda sqrt(n) u + nb u (the sums over keys; each block's rescaling)
//   |d lse_i|  <= sum_j p_ij e_ij + r_i + 2u (|lse_i| + 1)
// backward (probabilities recomputed from lse: e'_ij = e_ij + |d lse_i|):
//   dp_ij = dout_i . v_j, D_i = dout_i . out_i (out as the forward stored it), each off by
//   lambda sqrt(hd) u sum_d |terms|, D also by sum_d |dout_id| |d out_id|;
//   |d ds_ij| <= scale p_ij (e'_ij |dp_ij - D_i| + |d dp_ij| + |d D_i|) + 3u |ds_ij| =: f_ij
//   |d dv_jd| <= sum_i p_ij |dout_id| (e'_ij + lambda sqrt(n_j) u)
//   |d dq_id| <= sum_j f_ij |k_jd| + lambda sqrt(n) u sum_j |ds_ij k_jd|
//   |d dk_jd| <= sum_i f_ij |q_id| + lambda sqrt(n_j) u sum_i |ds_ij q_id|
// (n_j: the queries that see key j). A kv head's k and v gradients add over its query
// heads, and so do their bounds, plus the group's own sum (group u sum |terms|).
template <typename Values>
Reference reference(const Values& qkv, const std::vector<double>& dout, const AttentionShape& s,
                    const int32_t* key_begin = nullptr, int block = 64) {
  constexpr double u = 0x1p-24, lambda = 6.0;
  const double scale = 1.0 / std::sqrt(double(s.hd));
  const double sqrt_hd = std::sqrt(double(s.hd));
  Reference r;
  r.out.assign(s.out_size(), 0.0);
  r.out_bound.assign(s.out_size(), 0.0);
  r.lse.assign(s.lse_size(), 0.0);
  r.lse_bound.assign(s.lse_size(), 0.0);
  r.dqkv.assign(s.qkv_size(), 0.0);
  r.dqkv_bound.assign(s.qkv_size(), 0.0);
  auto x = [&](int b, int t, int group, int head, int d) {
    return double(qkv[qkv_index(s, b, t, group, head, d)]);
  };
  // Per query head, k and v gradients and their magnitudes before the group's sum.
  std::vector<double> dk(static_cast<size_t>(s.T) * s.hd), dv(dk.size()), dk_mag(dk.size()),
      dv_mag(dk.size()), dk_sum_mag(dk.size());
  std::vector<double> p, scaled, e, dp, ds, f, seen_by(static_cast<size_t>(s.T));
  for (int b = 0; b < s.B; ++b)
    for (int g = 0; g < s.kv_heads(); ++g) {
      std::vector<double> group_dk(dk.size(), 0.0), group_dv(dk.size(), 0.0);
      std::vector<double> group_dk_bound(dk.size(), 0.0), group_dv_bound(dk.size(), 0.0);
      std::vector<double> group_dk_abs(dk.size(), 0.0), group_dv_abs(dk.size(), 0.0);
      for (int h = g * (s.H / s.kv_heads()); h < (g + 1) * (s.H / s.kv_heads()); ++h) {
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        std::fill(dk_mag.begin(), dk_mag.end(), 0.0);
        std::fill(dv_mag.begin(), dv_mag.end(), 0.0);
        std::fill(dk_sum_mag.begin(), dk_sum_mag.end(), 0.0);
        std::fill(seen_by.begin(), seen_by.end(), 0.0);
        for (int i = 0; i < s.T; ++i)
          for (int j = first_key(key_begin, s, b, i); j <= i; ++j) seen_by[j] += 1.0;
        for (int i = 0; i < s.T; ++i) {
          const int j0 = first_key(key_begin, s, b, i);
          const double lse = softmax_row(qkv, s, b, h, i, p, key_begin);
          const double n = i - j0 + 1;
          const double nb = i / block - j0 / block + 1;
          const double r_i = lambda * std::sqrt(n) * u + nb * u;
          // Scaled scores, their maximum m_i and e_ij.
          scaled.assign(p.size(), 0.0);
          e.assign(p.size(), 0.0);
          double m = -1e300;
          for (int j = j0; j <= i; ++j) {
            double dot = 0.0, mag = 0.0;
            for (int d = 0; d < s.hd; ++d) {
              dot += x(b, i, 0, h, d) * x(b, j, 1, g, d);
              mag += std::fabs(x(b, i, 0, h, d) * x(b, j, 1, g, d));
            }
            scaled[j] = dot * scale;
            e[j] = lambda * sqrt_hd * u * scale * mag;
            m = std::max(m, scaled[j]);
          }
          double pe = 0.0;
          for (int j = j0; j <= i; ++j) {
            e[j] += 2 * u * (std::fabs(scaled[j]) + std::fabs(scaled[j] - m)) + 5 * u;
            pe += p[j] * e[j];
          }
          const size_t li = lse_index(s, b, h, i);
          r.lse[li] = lse;
          r.lse_bound[li] = pe + r_i + 2 * u * (std::fabs(lse) + 1);
          // Forward output and its bound.
          double D = 0.0, D_mag = 0.0, D_err = 0.0;
          for (int d = 0; d < s.hd; ++d) {
            double acc = 0.0, mag = 0.0;
            for (int j = j0; j <= i; ++j) {
              acc += p[j] * x(b, j, 2, g, d);
              mag += p[j] * std::fabs(x(b, j, 2, g, d)) * (e[j] + r_i);
            }
            const size_t oi = out_index(s, b, i, h, d);
            r.out[oi] = acc;
            r.out_bound[oi] = mag + std::fabs(acc) * (pe + r_i + 2 * u);
            D += dout[oi] * acc;
            D_mag += std::fabs(dout[oi] * acc);
            D_err += std::fabs(dout[oi]) * r.out_bound[oi];
          }
          D_err += lambda * sqrt_hd * u * D_mag;
          // Backward: dP, dS and their bounds.
          dp.assign(p.size(), 0.0);
          ds.assign(p.size(), 0.0);
          f.assign(p.size(), 0.0);
          for (int j = j0; j <= i; ++j) {
            double dp_mag = 0.0;
            for (int d = 0; d < s.hd; ++d) {
              const double go = dout[out_index(s, b, i, h, d)], v = x(b, j, 2, g, d);
              dp[j] += go * v;
              dp_mag += std::fabs(go * v);
              const size_t kv = static_cast<size_t>(j) * s.hd + d;
              dv[kv] += p[j] * go;
              dv_mag[kv] += p[j] * std::fabs(go) *
                            (e[j] + r.lse_bound[li] + lambda * std::sqrt(seen_by[j]) * u);
            }
            ds[j] = p[j] * (dp[j] - D) * scale;
            const double e_recomputed = e[j] + r.lse_bound[li];
            const double dp_err = lambda * sqrt_hd * u * dp_mag;
            f[j] = scale * p[j] * (e_recomputed * std::fabs(dp[j] - D) + dp_err + D_err) +
                   3 * u * std::fabs(ds[j]);
          }
          for (int d = 0; d < s.hd; ++d) {
            double acc = 0.0, bound = 0.0, terms = 0.0;
            for (int j = j0; j <= i; ++j) {
              const double k = x(b, j, 1, g, d), q = x(b, i, 0, h, d);
              acc += ds[j] * k;
              bound += f[j] * std::fabs(k);
              terms += std::fabs(ds[j] * k);
              const size_t kv = static_cast<size_t>(j) * s.hd + d;
              dk[kv] += ds[j] * q;
              dk_mag[kv] += f[j] * std::fabs(q);
              dk_sum_mag[kv] += std::fabs(ds[j] * q);
            }
            const size_t qi = qkv_index(s, b, i, 0, h, d);
            r.dqkv[qi] = acc;
            r.dqkv_bound[qi] = bound + lambda * std::sqrt(n) * u * terms;
          }
        }
        for (size_t kv = 0; kv < dk.size(); ++kv) {
          const double n_j = seen_by[kv / s.hd];
          group_dk[kv] += dk[kv];
          group_dv[kv] += dv[kv];
          group_dk_bound[kv] += dk_mag[kv] + lambda * std::sqrt(n_j) * u * dk_sum_mag[kv];
          group_dv_bound[kv] += dv_mag[kv];
          group_dk_abs[kv] += std::fabs(dk[kv]);
          group_dv_abs[kv] += std::fabs(dv[kv]);
        }
      }
      const double group = s.H / s.kv_heads();
      for (int t = 0; t < s.T; ++t)
        for (int d = 0; d < s.hd; ++d) {
          const size_t kv = static_cast<size_t>(t) * s.hd + d;
          const size_t ki = qkv_index(s, b, t, 1, g, d), vi = qkv_index(s, b, t, 2, g, d);
          r.dqkv[ki] = group_dk[kv];
          r.dqkv_bound[ki] = group_dk_bound[kv] + group * u * group_dk_abs[kv];
          r.dqkv[vi] = group_dv[kv];
          r.dqkv_bound[vi] = group_dv_bound[kv] + group * u * group_dv_abs[kv];
        }
    }
  return r;
}

}  // namespace naive_attention
