// TEMPORARY (never committed): naive stand-ins for the kernels helper's GQA attention,
// RoPE, RMSNorm and SwiGLU, so the Llama model can be checked against the fixtures
// before the real kernels land.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/embedding.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm::tmpk {

using namespace shardlm::cpu;

inline float rd(ConstTypedPtr p, int64_t i) {
  float v = 0;
  with_reader(p, [&](auto r) { v = r(i); });
  return v;
}
inline void wr(TypedPtr p, int64_t i, float v) {
  with_writer(p, [&](auto w) { w(i, v); });
}

struct RopeScaling {
  std::string type = "default";
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int original_max_position_embeddings = 8192;
};

class RopeTable {
 public:
  RopeTable(int head_dim, int max_positions, double theta, const RopeScaling& s, MemoryTracker& = MemoryTracker::global())
      : half(head_dim / 2), cos_(static_cast<size_t>(max_positions) * half), sin_(cos_.size()) {
    for (int i = 0; i < half; ++i) {
      double inv = 1.0 / std::pow(theta, 2.0 * i / head_dim);
      if (s.type == "llama3") {
        const double old = s.original_max_position_embeddings;
        const double low_wl = old / s.low_freq_factor, high_wl = old / s.high_freq_factor;
        const double wl = 2 * M_PI / inv;
        if (wl > low_wl) {
          inv = inv / s.factor;
        } else if (wl >= high_wl) {
          const double smooth = (old / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          inv = (1 - smooth) * inv / s.factor + smooth * inv;
        }
      }
      for (int p = 0; p < max_positions; ++p) {
        cos_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(p * inv));
        sin_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(p * inv));
      }
    }
  }
  static int64_t bytes(int head_dim, int max_positions) { return 0 * head_dim * max_positions; }
  int half;
  std::vector<float> cos_, sin_;
};

inline void rope_forward(TypedPtr y, int64_t ldy, const float* x, int64_t ldx, int64_t rows, int heads, int hd,
                         const int32_t* pos, const RopeTable& t) {
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const float c = t.cos_[static_cast<size_t>(pos[r]) * t.half + i], s = t.sin_[static_cast<size_t>(pos[r]) * t.half + i];
        const float a = x[r * ldx + h * hd + i], b = x[r * ldx + h * hd + i + hd / 2];
        wr(y, r * ldy + h * hd + i, a * c - b * s);
        wr(y, r * ldy + h * hd + i + hd / 2, b * c + a * s);
      }
}
inline void rope_backward(float* dx, int64_t ldd, const float* dy, int64_t ldy, int64_t rows, int heads, int hd,
                          const int32_t* pos, const RopeTable& t) {
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const float c = t.cos_[static_cast<size_t>(pos[r]) * t.half + i], s = t.sin_[static_cast<size_t>(pos[r]) * t.half + i];
        const float a = dy[r * ldy + h * hd + i], b = dy[r * ldy + h * hd + i + hd / 2];
        dx[r * ldd + h * hd + i] = a * c + b * s;
        dx[r * ldd + h * hd + i + hd / 2] = b * c - a * s;
      }
}

// y = x * rstd * w over rows of C; x may be compute-type.
inline void rmsnorm_rows(TypedPtr y, int64_t ldy, float* rstd, ConstTypedPtr x, int64_t ldx, const float* w,
                         int64_t rows, int C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < C; ++i) { const double v = rd(x, r * ldx + i); ss += v * v; }
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / C + eps));
    rstd[r] = rs;
    for (int i = 0; i < C; ++i) wr(y, r * ldy + i, rd(x, r * ldx + i) * rs * w[i]);
  }
}
inline void rmsnorm_rows_backward(float* dx, int64_t lddx, float* dw, const float* dy, int64_t lddy, ConstTypedPtr x,
                                  int64_t ldx, const float* w, const float* rstd, int64_t rows, int C, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int i = 0; i < C; ++i) dot += static_cast<double>(dy[r * lddy + i]) * w[i] * rd(x, r * ldx + i);
    const double rs = rstd[r];
    for (int i = 0; i < C; ++i) {
      const double xv = rd(x, r * ldx + i);
      const double g = rs * (dy[r * lddy + i] * w[i] - xv * rs * rs * dot / C);
      dx[r * lddx + i] = static_cast<float>((accumulate ? dx[r * lddx + i] : 0.0) + g);
      dw[i] += static_cast<float>(dy[r * lddy + i] * xv * rs);
    }
  }
}
inline void rmsnorm_forward(TypedPtr y, float* rstd, ConstTypedPtr x, const float* w, int64_t rows, int C, float eps) {
  rmsnorm_rows(y, C, rstd, x, C, w, rows, C, eps);
}
inline void residual_rmsnorm_forward(float* res, TypedPtr y, float* rstd, const float* a, const float* b,
                                     const float* bias, const float* w, int64_t rows, int C, float eps) {
  for (int64_t r = 0; r < rows; ++r) residual_add_bias_row(res + r * C, a + r * C, b + r * C, bias, C);
  rmsnorm_rows(y, C, rstd, res, C, w, rows, C, eps);
}
inline void rmsnorm_backward(float* dx, float* dw, const float* dy, ConstTypedPtr x, const float* w, const float* rstd,
                             int64_t rows, int C, bool accumulate) {
  rmsnorm_rows_backward(dx, C, dw, dy, C, x, C, w, rstd, rows, C, accumulate);
}
inline void rmsnorm_heads_forward(float* y, int64_t ldy, float* rstd, ConstTypedPtr x, int64_t ldx, const float* w,
                                  int64_t rows, int heads, int hd, float eps) {
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      rmsnorm_rows(TypedPtr(y + r * ldy + h * hd), hd, rstd + r * heads + h, x.at(r * ldx + h * hd), hd, w, 1, hd, eps);
}
inline void rmsnorm_heads_backward(float* dx, int64_t lddx, float* dw, const float* dy, int64_t lddy, ConstTypedPtr x,
                                   int64_t ldx, const float* w, const float* rstd, int64_t rows, int heads, int hd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      rmsnorm_rows_backward(dx + r * lddx + h * hd, hd, dw, dy + r * lddy + h * hd, hd, x.at(r * ldx + h * hd), hd, w,
                            rstd + r * heads + h, 1, hd, false);
}
inline void swiglu_forward(TypedPtr h, ConstTypedPtr gu, int64_t n, int I) {
  for (int64_t r = 0; r < n; ++r)
    for (int i = 0; i < I; ++i) {
      const float g = rd(gu, r * 2 * I + i), u = rd(gu, r * 2 * I + I + i);
      wr(h, r * I + i, g / (1.0f + std::exp(-g)) * u);
    }
}
inline void swiglu_backward(float* dgu, const float* dh, ConstTypedPtr gu, int64_t n, int I) {
  for (int64_t r = 0; r < n; ++r)
    for (int i = 0; i < I; ++i) {
      const double g = rd(gu, r * 2 * I + i), u = rd(gu, r * 2 * I + I + i);
      const double sg = 1.0 / (1.0 + std::exp(-g));
      const double d = dh[r * I + i];
      dgu[r * 2 * I + i] = static_cast<float>(d * u * sg * (1 + g * (1 - sg)));
      dgu[r * 2 * I + I + i] = static_cast<float>(d * g * sg);
    }
}
inline void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte, ConstTypedPtr, int B, int T, int C,
                              DType value_type) {
  for (int64_t r = 0; r < static_cast<int64_t>(B) * T; ++r)
    for (int i = 0; i < C; ++i) out[r * C + i] = round_to(value_type, rd(wte, static_cast<int64_t>(tokens[r]) * C + i));
}
inline void embedding_backward(float* dwte, float*, const float* dout, const int32_t* tokens, int B, int T, int C) {
  for (int64_t r = 0; r < static_cast<int64_t>(B) * T; ++r)
    for (int i = 0; i < C; ++i) dwte[static_cast<int64_t>(tokens[r]) * C + i] += dout[r * C + i];
}

}  // namespace shardlm::tmpk
