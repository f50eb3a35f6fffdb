// Elementwise kernels of the CUDA backend: conversions, bias adds, GELU, SwiGLU, RoPE,
// embedding lookup, NF4 dequantization, AdamW and the vocabulary-parallel lookup's
// masking, per-row loss and softmax gradient. Each thread handles whole elements
// (grid-stride loops), reads before it writes the same indices, so the in-place forms
// the cpu:: contracts allow (out == in) are safe. Formulas are written in the CPU
// kernels' operation order (device_math.cuh says how close that makes them).
#include <algorithm>

#include "shardlm/backend/cuda/device_math.cuh"
#include "shardlm/backend/cuda/kernels.cuh"

namespace shardlm::cuda::kernels {

using namespace device;

namespace {

constexpr int kThreads = kGridThreads;
int blocks_for(int64_t n) { return grid_blocks(n); }

// --- conversions ---------------------------------------------------------------------------

template <typename Dst, typename Src>
__global__ void convert_kernel(typename Dst::Storage* dst, const typename Src::Storage* src,
                               int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) Dst::store(dst, i, Src::load(src, i));
}

// [rows, cols] with row strides; one flat index over rows * cols (the division is
// cheap next to the memory traffic, and consecutive threads stay on one row).
template <typename Dst, typename Src>
__global__ void convert_rows_kernel(typename Dst::Storage* dst, int64_t ld_dst,
                                    const typename Src::Storage* src, int64_t ld_src, int64_t rows,
                                    int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const int64_t r = i / cols, c = i - r * cols;
    Dst::store(dst, r * ld_dst + c, Src::load(src, r * ld_src + c));
  }
}

template <typename T>
__global__ void round_to_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) dst[i] = T::round(src[i]);
}

__global__ void accumulate_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) dst[i] += src[i];
}

__global__ void scale_rows_kernel(float* C, int64_t ld, int64_t rows, int64_t cols, float beta) {
  const int64_t n = rows * cols;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const int64_t r = i / cols, c = i - r * cols;
    float* x = C + r * ld + c;
    *x = beta == 0.0f ? 0.0f : beta * *x;
  }
}

// --- bias, GELU, SwiGLU ----------------------------------------------------------------------

__global__ void add_bias_inplace_kernel(float* out, const float* bias, int64_t N, int M) {
  const int64_t n = N * M;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) out[i] += bias[i % M];
}

template <typename Out>
__global__ void add_bias_kernel(typename Out::Storage* out, const float* in, const float* bias,
                                int64_t N, int M) {
  const int64_t n = N * M;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) Out::store(out, i, in[i] + bias[i % M]);
}

__global__ void residual_add_bias_kernel(float* out, const float* a, const float* branch,
                                         const float* bias, int64_t N, int M) {
  const int64_t n = N * M;
  for (int64_t i = grid_first(); i < n; i += grid_stride())
    out[i] = bias != nullptr ? a[i] + branch[i] + bias[i % M] : a[i] + branch[i];
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  const float t = tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

__device__ __forceinline__ float gelu_derivative(float x) {
  const float t = tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

// x rounded to pre's type before GELU, so the backward differentiates at the stored
// input (cpu/gelu.hpp). pre_in may be pre_out (fp32): read before written.
template <typename Out, typename Pre>
__global__ void bias_gelu_kernel(typename Out::Storage* out, typename Pre::Storage* pre_out,
                                 const float* pre_in, const float* bias, int64_t N, int M) {
  const int64_t n = N * M;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const float x = Pre::round(bias != nullptr ? pre_in[i] + bias[i % M] : pre_in[i]);
    Pre::store(pre_out, i, x);
    Out::store(out, i, gelu(x));
  }
}

template <typename Pre>
__global__ void gelu_backward_kernel(float* dinp, const float* dout,
                                     const typename Pre::Storage* pre, int64_t count) {
  for (int64_t i = grid_first(); i < count; i += grid_stride())
    dinp[i] = dout[i] * gelu_derivative(Pre::load(pre, i));
}

// 1 / (1 + e^-g): finite in (0, 1] for every g (exp_approx clamps), never NaN.
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + exp_approx(-g)); }

// One thread per (row, i < I): gate at column i, up at I + i of the [N, 2I] row.
template <typename H, typename Stored>
__global__ void swiglu_forward_kernel(typename H::Storage* h, typename Stored::Storage* gate_up_out,
                                      const float* gate_up_in, int64_t N, int I) {
  const int64_t n = N * I;
  for (int64_t idx = grid_first(); idx < n; idx += grid_stride()) {
    const int64_t row = idx / I, i = idx - row * I;
    const int64_t gate_at = row * 2 * I + i, up_at = gate_at + I;
    const float g = Stored::round(gate_up_in[gate_at]);
    const float up = Stored::round(gate_up_in[up_at]);
    Stored::store(gate_up_out, gate_at, g);
    Stored::store(gate_up_out, up_at, up);
    H::store(h, idx, g * sigmoid(g) * up);
  }
}

template <typename Stored>
__global__ void swiglu_backward_kernel(float* dgate_up, const float* dh,
                                       const typename Stored::Storage* gate_up, int64_t N, int I) {
  const int64_t n = N * I;
  for (int64_t idx = grid_first(); idx < n; idx += grid_stride()) {
    const int64_t row = idx / I, i = idx - row * I;
    const int64_t gate_at = row * 2 * I + i, up_at = gate_at + I;
    const float g = Stored::load(gate_up, gate_at), up = Stored::load(gate_up, up_at);
    const float grad = dh[idx];
    const float sig = sigmoid(g);
    dgate_up[gate_at] = grad * up * sig * (1.0f + g * (1.0f - sig));
    dgate_up[up_at] = grad * (g * sig);
  }
}

// --- RoPE, embeddings, NF4 ---------------------------------------------------------------------

// One thread per (row, head, i < half): it reads both values of its pair before
// writing them, so x may be y (fp32, in place).
template <typename Y>
__global__ void rope_kernel(typename Y::Storage* y, int64_t ld_y, const float* x, int64_t ld_x,
                            int64_t rows, int heads, int head_dim, const int32_t* positions,
                            const float* cos_table, const float* sin_table, float sign) {
  const int half = head_dim / 2;
  const int64_t n = rows * heads * half;
  for (int64_t idx = grid_first(); idx < n; idx += grid_stride()) {
    const int64_t pair = idx / half;
    const int i = static_cast<int>(idx - pair * half);
    const int64_t r = pair / heads;
    const int h = static_cast<int>(pair - r * heads);
    const int64_t table_at = static_cast<int64_t>(positions[r]) * half + i;
    const float c = cos_table[table_at], s = sign * sin_table[table_at];
    const float* in = x + r * ld_x + static_cast<int64_t>(h) * head_dim;
    const int64_t out_at = r * ld_y + static_cast<int64_t>(h) * head_dim;
    const float first = in[i], second = in[i + half];
    Y::store(y, out_at + i, first * c - second * s);
    Y::store(y, out_at + i + half, second * c + first * s);
  }
}

// out[n, c] = round(wte[token, c]) (+ round(wpe[pos, c])), rounded to value_type first.
template <typename Value, typename Tok, typename Pos>
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens,
                                         const typename Tok::Storage* wte,
                                         const typename Pos::Storage* wpe, int64_t N, int T, int C,
                                         const int32_t* positions) {
  const int64_t total = N * C;
  for (int64_t idx = grid_first(); idx < total; idx += grid_stride()) {
    const int64_t n = idx / C;
    const int c = static_cast<int>(idx - n * C);
    const float token_value = Value::round(Tok::load(wte, static_cast<int64_t>(tokens[n]) * C + c));
    if (wpe == nullptr) {
      out[idx] = token_value;
    } else {
      const int64_t pos = positions != nullptr ? positions[n] : n % T;
      out[idx] = token_value + Value::round(Pos::load(wpe, pos * C + c));
    }
  }
}

__constant__ float kNf4CodeTable[16] = {-1.0f,
                                        -0.6961928009986877f,
                                        -0.5250730514526367f,
                                        -0.39491748809814453f,
                                        -0.28444138169288635f,
                                        -0.18477343022823334f,
                                        -0.09105003625154495f,
                                        0.0f,
                                        0.07958029955625534f,
                                        0.16093020141124725f,
                                        0.24611230194568634f,
                                        0.33791524171829224f,
                                        0.44070982933044434f,
                                        0.5626170039176941f,
                                        0.7229568362236023f,
                                        1.0f};

// Storage (cpu/nf4.hpp): absmax per 64-value block (fp32 words), then two codes per
// byte, the earlier value in the high nibble. x = code * absmax in fp32, then stored.
template <typename Out>
__global__ void nf4_dequantize_kernel(const float* absmax, const uint8_t* bytes, int64_t n,
                                      typename Out::Storage* out) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const uint8_t b = bytes[i / 2];
    const int code = (i % 2 == 0) ? (b >> 4) : (b & 15);
    Out::store(out, i, kNf4CodeTable[code] * absmax[i / 64]);
  }
}

// --- AdamW ---------------------------------------------------------------------------------------

struct AdamDecayRanges {
  int64_t begin[kAdamInlineRanges];
  int64_t end[kAdamInlineRanges];
  int count = 0;
};

// backend/cpu/adamw.cpp's adam_scalar, the same explicit fmas and roundings; over [lo, hi).
template <typename Rounded>
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, int64_t lo,
                             int64_t hi, AdamDecayRanges ranges, AdamConstants plain,
                             AdamConstants decayed, typename Rounded::Storage* rounded) {
  for (int64_t i = lo + grid_first(); i < hi; i += grid_stride()) {
    bool in_range = false;
    for (int r = 0; r < ranges.count && !in_range; ++r)
      in_range = ranges.begin[r] <= i && i < ranges.end[r];
    const AdamConstants& c = in_range ? decayed : plain;
    const float g = grads[i] * c.grad_multiplier;
    const float p = params[i] * c.decay_factor;
    const float mi = fmaf(c.beta1, m[i], c.one_minus_beta1 * g);
    const float vi = fmaf(c.beta2, v[i], (c.one_minus_beta2 * g) * g);
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / c.bias2_sqrt + c.eps;
    const float updated = fmaf(-c.step_size, mi / denom, p);
    params[i] = updated;
    if (rounded != nullptr) Rounded::store(rounded, i, updated);
  }
}

// --- the vocabulary-parallel lookup's masking, the loss and its gradient over a shard -------

__global__ void vocab_shard_localize_kernel(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                                            VocabShardRows shard) {
  for (int64_t i = grid_first(); i < n; i += grid_stride())
    local_tokens[i] = vocab_shard_holds(shard, tokens[i]) ? static_cast<int32_t>(tokens[i] - shard.begin) : 0;
}

__global__ void vocab_shard_mask_rows_kernel(float* rows, const int32_t* tokens, int64_t n, int C,
                                             VocabShardRows shard) {
  const int64_t total = n * C;
  for (int64_t idx = grid_first(); idx < total; idx += grid_stride())
    if (!vocab_shard_holds(shard, tokens[idx / C])) rows[idx] = 0.0f;
}

__global__ void vocab_shard_loss_kernel(float* losses, const float* row_max, const float* sums,
                                        const int32_t* targets, int rows) {
  for (int64_t r = grid_first(); r < rows; r += grid_stride())
    losses[r] = targets[r] < 0 ? 0.0f : row_max[r] + logf(sums[2 * r]) - sums[2 * r + 1];
}

// e * (grad_scale / sum), then minus grad_scale at a held target: the CPU's two steps.
__global__ void vocab_shard_softmax_backward_kernel(float* logits, int64_t ld, const float* sums,
                                                    const int32_t* targets, int rows,
                                                    float grad_scale, VocabShardRows shard) {
  const int64_t total = static_cast<int64_t>(rows) * shard.real;
  for (int64_t idx = grid_first(); idx < total; idx += grid_stride()) {
    const int64_t r = idx / shard.real;
    const int64_t j = idx - r * shard.real;
    float* value = logits + r * ld + j;
    const int32_t t = targets[r];
    if (t < 0) {
      *value = 0.0f;
      continue;
    }
    float g = *value * (grad_scale / sums[2 * r]);
    if (vocab_shard_holds(shard, t) && j == t - shard.begin) g -= grad_scale;
    *value = g;
  }
}

}  // namespace

// --- launchers -----------------------------------------------------------------------------------

cudaError_t convert(cudaStream_t stream, TypedPtr dst, ConstTypedPtr src, int64_t n) {
  if (n <= 0) return cudaGetLastError();
  with_type(dst.dtype, [&](auto d) {
    with_type(src.dtype, [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      const auto kernel = &convert_kernel<D, S>;
      SHARDLM_KERNEL(kernel, blocks_for(n), kThreads, stream,
                     static_cast<typename D::Storage*>(dst.data),
                     static_cast<const typename S::Storage*>(src.data), n);
    });
  });
  return cudaGetLastError();
}

cudaError_t convert_rows(cudaStream_t stream, TypedPtr dst, int64_t ld_dst, ConstTypedPtr src,
                         int64_t ld_src, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaGetLastError();
  with_type(dst.dtype, [&](auto d) {
    with_type(src.dtype, [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      const auto kernel = &convert_rows_kernel<D, S>;
      SHARDLM_KERNEL(kernel, blocks_for(rows * cols), kThreads, stream,
                     static_cast<typename D::Storage*>(dst.data), ld_dst,
                     static_cast<const typename S::Storage*>(src.data), ld_src, rows, cols);
    });
  });
  return cudaGetLastError();
}

cudaError_t round_to(cudaStream_t stream, DType dtype, float* dst, const float* src, int64_t n) {
  if (n <= 0) return cudaGetLastError();
  with_type(dtype, [&](auto t) {
    const auto kernel = &round_to_kernel<decltype(t)>;
    SHARDLM_KERNEL(kernel, blocks_for(n), kThreads, stream, dst, src, n);
  });
  return cudaGetLastError();
}

cudaError_t accumulate(cudaStream_t stream, float* dst, const float* src, int64_t n) {
  if (n <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(accumulate_kernel, blocks_for(n), kThreads, stream, dst, src, n);
  return cudaGetLastError();
}

cudaError_t scale_rows(cudaStream_t stream, float* C, int64_t ld, int64_t rows, int64_t cols,
                       float beta) {
  if (rows <= 0 || cols <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(scale_rows_kernel, blocks_for(rows * cols), kThreads, stream, C, ld, rows, cols,
                 beta);
  return cudaGetLastError();
}

cudaError_t add_bias_inplace(cudaStream_t stream, float* out, const float* bias, int64_t N, int M) {
  if (N <= 0 || M <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(add_bias_inplace_kernel, blocks_for(N * M), kThreads, stream, out, bias, N, M);
  return cudaGetLastError();
}

cudaError_t add_bias(cudaStream_t stream, TypedPtr out, const float* in, const float* bias,
                     int64_t N, int M) {
  if (N <= 0 || M <= 0) return cudaGetLastError();
  with_type(out.dtype, [&](auto o) {
    using O = decltype(o);
    const auto kernel = &add_bias_kernel<O>;
    SHARDLM_KERNEL(kernel, blocks_for(N * M), kThreads, stream,
                   static_cast<typename O::Storage*>(out.data), in, bias, N, M);
  });
  return cudaGetLastError();
}

cudaError_t residual_add_bias(cudaStream_t stream, float* out, const float* a, const float* branch,
                              const float* bias, int64_t N, int M) {
  if (N <= 0 || M <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(residual_add_bias_kernel, blocks_for(N * M), kThreads, stream, out, a, branch,
                 bias, N, M);
  return cudaGetLastError();
}

cudaError_t bias_gelu_forward(cudaStream_t stream, TypedPtr out, TypedPtr pre_out,
                              const float* pre_in, const float* bias, int64_t N, int M) {
  if (N <= 0 || M <= 0) return cudaGetLastError();
  with_type(out.dtype, [&](auto o) {
    with_type(pre_out.dtype, [&](auto p) {
      using O = decltype(o);
      using P = decltype(p);
      const auto kernel = &bias_gelu_kernel<O, P>;
      SHARDLM_KERNEL(kernel, blocks_for(N * M), kThreads, stream,
                     static_cast<typename O::Storage*>(out.data),
                     static_cast<typename P::Storage*>(pre_out.data), pre_in, bias, N, M);
    });
  });
  return cudaGetLastError();
}

cudaError_t gelu_backward(cudaStream_t stream, float* dinp, const float* dout, ConstTypedPtr pre,
                          int64_t count) {
  if (count <= 0) return cudaGetLastError();
  with_type(pre.dtype, [&](auto p) {
    using P = decltype(p);
    const auto kernel = &gelu_backward_kernel<P>;
    SHARDLM_KERNEL(kernel, blocks_for(count), kThreads, stream, dinp, dout,
                   static_cast<const typename P::Storage*>(pre.data), count);
  });
  return cudaGetLastError();
}

cudaError_t swiglu_forward(cudaStream_t stream, TypedPtr h, TypedPtr gate_up_out,
                           const float* gate_up_in, int64_t N, int I) {
  if (N <= 0 || I <= 0) return cudaGetLastError();
  with_type(h.dtype, [&](auto ht) {
    with_type(gate_up_out.dtype, [&](auto st) {
      using H = decltype(ht);
      using S = decltype(st);
      const auto kernel = &swiglu_forward_kernel<H, S>;
      SHARDLM_KERNEL(kernel, blocks_for(N * I), kThreads, stream,
                     static_cast<typename H::Storage*>(h.data),
                     static_cast<typename S::Storage*>(gate_up_out.data), gate_up_in, N, I);
    });
  });
  return cudaGetLastError();
}

cudaError_t swiglu_backward(cudaStream_t stream, float* dgate_up, const float* dh,
                            ConstTypedPtr gate_up, int64_t N, int I) {
  if (N <= 0 || I <= 0) return cudaGetLastError();
  with_type(gate_up.dtype, [&](auto st) {
    using S = decltype(st);
    const auto kernel = &swiglu_backward_kernel<S>;
    SHARDLM_KERNEL(kernel, blocks_for(N * I), kThreads, stream, dgate_up, dh,
                   static_cast<const typename S::Storage*>(gate_up.data), N, I);
  });
  return cudaGetLastError();
}

cudaError_t rope_rotate(cudaStream_t stream, TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x,
                        int64_t rows, int heads, int head_dim, const int32_t* positions,
                        const RopeTableView& table, float sign) {
  const int64_t pairs = rows * heads * (head_dim / 2);
  if (pairs <= 0) return cudaGetLastError();
  with_type(y.dtype, [&](auto yt) {
    using Y = decltype(yt);
    const auto kernel = &rope_kernel<Y>;
    SHARDLM_KERNEL(kernel, blocks_for(pairs), kThreads, stream,
                   static_cast<typename Y::Storage*>(y.data), ld_y, x, ld_x, rows, heads, head_dim,
                   positions, table.cos, table.sin, sign);
  });
  return cudaGetLastError();
}

cudaError_t embedding_forward(cudaStream_t stream, float* out, const int32_t* tokens,
                              ConstTypedPtr wte, ConstTypedPtr wpe, int B, int T, int C,
                              DType value_type, const int32_t* positions) {
  const int64_t N = static_cast<int64_t>(B) * T;
  if (N <= 0 || C <= 0) return cudaGetLastError();
  // Without a position table its type is irrelevant: wte's stands in (one instance less).
  const DType pos_type = wpe.data != nullptr ? wpe.dtype : wte.dtype;
  with_type(value_type, [&](auto vt) {
    with_type(wte.dtype, [&](auto tt) {
      with_type(pos_type, [&](auto pt) {
        using V = decltype(vt);
        using Tk = decltype(tt);
        using P = decltype(pt);
        const auto kernel = &embedding_forward_kernel<V, Tk, P>;
        SHARDLM_KERNEL(kernel, blocks_for(N * C), kThreads, stream, out, tokens,
                       static_cast<const typename Tk::Storage*>(wte.data),
                       static_cast<const typename P::Storage*>(wpe.data), N, T, C, positions);
      });
    });
  });
  return cudaGetLastError();
}

cudaError_t nf4_dequantize(cudaStream_t stream, const void* in, int64_t n, TypedPtr out) {
  if (n <= 0) return cudaGetLastError();
  const int64_t blocks = (n + 63) / 64;
  const auto* absmax = static_cast<const float*>(in);
  const auto* bytes = static_cast<const uint8_t*>(in) + 4 * blocks;
  with_type(out.dtype, [&](auto ot) {
    using O = decltype(ot);
    const auto kernel = &nf4_dequantize_kernel<O>;
    SHARDLM_KERNEL(kernel, blocks_for(n), kThreads, stream, absmax, bytes, n,
                   static_cast<typename O::Storage*>(out.data));
  });
  return cudaGetLastError();
}

cudaError_t adamw_update(cudaStream_t stream, float* params, const float* grads, float* m, float* v,
                         int64_t n, const HostRange* decay_ranges, size_t range_count,
                         const AdamConstants& plain, const AdamConstants& decayed,
                         TypedPtr rounded_params) {
  if (n <= 0) return cudaGetLastError();
  // Without a rounded copy the fp32 instance runs with a null pointer (never stored).
  const DType rounded_type = rounded_params.data != nullptr ? rounded_params.dtype : DType::fp32;
  int64_t lo = 0;
  size_t next = 0;
  do {
    AdamDecayRanges ranges;
    while (next < range_count && ranges.count < kAdamInlineRanges) {
      ranges.begin[ranges.count] = decay_ranges[next].begin;
      ranges.end[ranges.count] = decay_ranges[next].end;
      ++ranges.count;
      ++next;
    }
    // This piece ends where the next batch's first range begins (ranges are sorted and
    // disjoint, so no element of [lo, hi) lies in a later batch, none after in this one).
    int64_t hi = n;
    if (next < range_count) hi = std::min(n, std::max(lo, decay_ranges[next].begin));
    if (hi > lo) {
      with_type(rounded_type, [&](auto rt) {
        using R = decltype(rt);
        const auto kernel = &adamw_kernel<R>;
        SHARDLM_KERNEL(kernel, blocks_for(hi - lo), kThreads, stream, params, grads, m, v, lo, hi,
                       ranges, plain, decayed,
                       static_cast<typename R::Storage*>(rounded_params.data));
      });
    }
    lo = hi;
  } while (lo < n);
  return cudaGetLastError();
}

cudaError_t vocab_shard_localize(cudaStream_t stream, int32_t* local_tokens, const int32_t* tokens,
                                 int64_t n, VocabShardRows shard) {
  if (n <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(vocab_shard_localize_kernel, blocks_for(n), kThreads, stream, local_tokens, tokens,
                 n, shard);
  return cudaGetLastError();
}

cudaError_t vocab_shard_mask_rows(cudaStream_t stream, float* rows, const int32_t* tokens, int64_t n,
                                  int C, VocabShardRows shard) {
  if (n <= 0 || C <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(vocab_shard_mask_rows_kernel, blocks_for(n * C), kThreads, stream, rows, tokens, n,
                 C, shard);
  return cudaGetLastError();
}

cudaError_t vocab_shard_loss(cudaStream_t stream, float* losses, const float* row_max,
                             const float* sums, const int32_t* targets, int rows) {
  if (rows <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(vocab_shard_loss_kernel, blocks_for(rows), kThreads, stream, losses, row_max, sums,
                 targets, rows);
  return cudaGetLastError();
}

cudaError_t vocab_shard_softmax_backward(cudaStream_t stream, float* logits, int64_t ld,
                                         const float* sums, const int32_t* targets, int rows,
                                         float grad_scale, VocabShardRows shard) {
  if (rows <= 0 || shard.real <= 0) return cudaGetLastError();
  SHARDLM_KERNEL(vocab_shard_softmax_backward_kernel,
                 blocks_for(static_cast<int64_t>(rows) * shard.real), kThreads, stream, logits, ld,
                 sums, targets, rows, grad_scale, shard);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda::kernels
