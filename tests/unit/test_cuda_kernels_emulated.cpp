// shardlm's own CUDA kernels (backend/cuda/attention.cu, cross_entropy.cu) compiled as
// plain C++ and run on the host (tests/cuda_emulation/include: a block is blockDim.x
// fibers, __syncthreads and shuffles are rounds of a scheduler), against the
// CPU kernels and a double reference. It runs in every build, GPU or not, and checks
// what can go wrong without a card: tile index arithmetic, partial tiles at T not a
// multiple of the tile, causal and key_begin masking, the skipped tiles, GQA sums, the
// head_dim buckets' padding, the storage types' rounding, that dqkv and the gradient
// rows are overwritten and that every thread reaches the same barriers. What it cannot
// check (speed, races the barriers would not expose, the real device intrinsics) is
// left to tests/unit/test_backend_ops.cpp on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/attention_block.hpp"
#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/error.hpp"
#include "kernel_test_helpers.hpp"
#include "naive_attention.hpp"
#include "relative_error.hpp"

#ifndef SHARDLM_CUDA_EMULATION
#error "tests/CMakeLists.txt builds this file with SHARDLM_CUDA_EMULATION and tests/cuda_emulation/include"
#endif

// The kernels' namespace renamed, so that a CUDA build's real shardlm::cuda functions
// (in shardlm_lib) and these host-thread instances do not collide.
#define cuda cuda_emulated
#include "shardlm/backend/cuda/attention.cu"
#include "shardlm/backend/cuda/attention_block.cu"
#include "shardlm/backend/cuda/cross_entropy.cu"
#undef cuda

namespace shardlm::cuda_emulated {
void check_kernel_launch(const char*, const char*, int) {}
void throw_kernel_argument_error(const std::string& message) { throw Error(message); }
}  // namespace shardlm::cuda_emulated

namespace {

using kernel_test::random_vec;
using kernel_test::Vec;
using shardlm::AttentionShape;
using shardlm::ConstTypedPtr;
using shardlm::DType;
using shardlm::TypedPtr;

// A tensor held in a storage type: fp32 values, or their 16-bit encodings.
struct Stored {
  DType dtype;
  Vec f32;
  std::vector<uint16_t> bits;

  Stored(DType type, size_t n) : dtype(type) {
    if (type == DType::fp32)
      f32.assign(n, std::numeric_limits<float>::quiet_NaN());
    else
      bits.assign(n, 0x7fc0);  // a NaN in bf16 and fp16 alike
  }
  Stored(DType type, const Vec& values) : Stored(type, values.size()) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (type == DType::fp32) f32[i] = values[i];
      if (type == DType::bf16) bits[i] = shardlm::float_to_bf16(values[i]);
      if (type == DType::fp16) bits[i] = shardlm::float_to_fp16(values[i]);
    }
  }
  TypedPtr ptr() {
    return dtype == DType::fp32 ? TypedPtr(f32.data()) : TypedPtr(bits.data(), dtype);
  }
  Vec widened() const {
    if (dtype == DType::fp32) return f32;
    Vec v(bits.size());
    for (size_t i = 0; i < bits.size(); ++i)
      v[i] = dtype == DType::bf16 ? shardlm::bf16_to_float(bits[i]) : shardlm::fp16_to_float(bits[i]);
    return v;
  }
};

struct AttentionCase {
  int B, T, n_head, n_kv_head, head_dim;
  DType dtype;
  std::vector<int> document_starts;  // empty: no key_begin; else the starts after 0, per row
  double out_tolerance;              // relative to max, against the CPU kernel
};

std::string case_name(const AttentionCase& c) {
  return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.n_head) +
         "kv" + std::to_string(c.n_kv_head) + "_hd" + std::to_string(c.head_dim) + "_" +
         std::string(shardlm::dtype_name(c.dtype)) + (c.document_starts.empty() ? "" : "_packed");
}

// key_begin of packed documents: each batch row starts documents at 0 and at
// document_starts (shifted by the row index, so the rows differ).
std::vector<int32_t> packed_key_begin(const AttentionCase& c) {
  std::vector<int32_t> key_begin(static_cast<size_t>(c.B) * c.T);
  for (int b = 0; b < c.B; ++b) {
    int begin = 0;
    for (int t = 0; t < c.T; ++t) {
      for (const int start : c.document_starts)
        if (t == start + b && start + b < c.T) begin = t;
      key_begin[static_cast<size_t>(b) * c.T + t] = begin;
    }
  }
  return key_begin;
}

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << case_name(c); }

class EmulatedAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(EmulatedAttention, ForwardAndBackwardMatchTheCpuKernels) {
  const AttentionCase& c = GetParam();
  AttentionShape s;
  s.B = c.B;
  s.T = c.T;
  s.n_head = c.n_head;
  s.n_kv_head = c.n_kv_head;
  s.head_dim = c.head_dim;
  const int64_t N = static_cast<int64_t>(c.B) * c.T;
  const std::vector<int32_t> key_begin_rows =
      c.document_starts.empty() ? std::vector<int32_t>{} : packed_key_begin(c);
  const int32_t* key_begin = key_begin_rows.empty() ? nullptr : key_begin_rows.data();

  Stored qkv(c.dtype, random_vec(N * s.qkv_columns(), 11 + c.T, 1.5));
  // The CPU reference: fp32 arithmetic on the stored values (the widening path).
  Stored cpu_out(c.dtype, N * s.out_columns());
  Vec cpu_lse(static_cast<size_t>(c.B) * c.n_head * c.T);
  shardlm::cpu::attention_forward_on(shardlm::cpu::Bf16AttentionPath::kWidenToFp32, cpu_out.ptr(),
                                     cpu_lse.data(), qkv.ptr(), s, key_begin);

  Stored gpu_out(c.dtype, N * s.out_columns());
  Vec gpu_lse(cpu_lse.size(), std::numeric_limits<float>::quiet_NaN());
  shardlm::cuda_emulated::attention_forward(nullptr, gpu_out.ptr(), gpu_lse.data(), qkv.ptr(), s,
                                            key_begin);
  EXPECT_LT(relative_to_max_error(gpu_out.widened(), cpu_out.widened()), c.out_tolerance);
  EXPECT_LT(relative_to_max_error(gpu_lse, cpu_lse), 2e-6);

  // Backward on the same (CPU) forward results, so both see identical inputs.
  const Vec dout = random_vec(N * s.out_columns(), 29 + c.T);
  Vec cpu_dqkv(N * s.qkv_columns());
  shardlm::cpu::attention_backward_on(shardlm::cpu::Bf16AttentionPath::kWidenToFp32,
                                      cpu_dqkv.data(), dout.data(), qkv.ptr(), cpu_out.ptr(),
                                      cpu_lse.data(), s, key_begin);
  // NaN everywhere first: every element must be overwritten.
  Vec gpu_dqkv(cpu_dqkv.size(), std::numeric_limits<float>::quiet_NaN());
  // GQA's per-query-head slots, NaN too: each must be written before the group sum reads it.
  Vec slots(shardlm::cuda_emulated::attention_backward_scratch_bytes(s) / sizeof(float),
            std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(slots.empty(), c.n_head == c.n_kv_head);
  shardlm::cuda_emulated::attention_backward(nullptr, gpu_dqkv.data(), dout.data(), qkv.ptr(),
                                             cpu_out.ptr(), cpu_lse.data(), s, key_begin,
                                             slots.empty() ? nullptr : slots.data());
  EXPECT_LT(relative_to_max_error(gpu_dqkv, cpu_dqkv), 2e-5);

  // fp32: every element within the double reference's bound on an fp32 kernel's error
  // (naive_attention.hpp; its blocking term with this kernel's tile of kRows keys).
  if (c.dtype == DType::fp32) {
    naive_attention::AttentionShape ns{c.B, c.T, c.n_head, c.head_dim, c.n_kv_head};
    std::vector<double> dout_d(dout.begin(), dout.end());
    const naive_attention::Reference want =
        naive_attention::reference(qkv.f32, dout_d, ns, key_begin, c.head_dim <= 64 ? 64 : 32);
    int outside = 0;
    for (size_t i = 0; i < gpu_dqkv.size(); ++i)
      if (!(std::fabs(double(gpu_dqkv[i]) - want.dqkv[i]) <= want.dqkv_bound[i]) && ++outside <= 3)
        ADD_FAILURE() << "dqkv[" << i << "] = " << gpu_dqkv[i] << ", the double reference "
                      << want.dqkv[i] << " +- " << want.dqkv_bound[i];
    EXPECT_EQ(outside, 0);
    int out_outside = 0;
    const Vec got_out = gpu_out.widened();
    for (size_t i = 0; i < got_out.size(); ++i)
      if (!(std::fabs(double(got_out[i]) - want.out[i]) <= want.out_bound[i])) ++out_outside;
    EXPECT_EQ(out_outside, 0) << "forward outputs outside the double reference's bound";
  }
}

// The GQA backward's group sum is the CPU kernel's: a kv head's dK and dV are its query
// heads' slots (each head's own gradient) added in head order, bit for bit.
TEST(EmulatedAttention, GqaSumsTheQueryHeadsInHeadOrder) {
  AttentionShape s;
  s.B = 1;
  s.T = 70;
  s.n_head = 3;
  s.n_kv_head = 1;
  s.head_dim = 64;
  const int64_t N = s.T;
  const Vec qkv = random_vec(N * s.qkv_columns(), 7, 1.5);
  Vec out(N * s.out_columns()), lse(size_t(s.n_head) * s.T);
  shardlm::cpu::attention_forward_on(shardlm::cpu::Bf16AttentionPath::kWidenToFp32, TypedPtr(out.data()),
                                     lse.data(), ConstTypedPtr(qkv.data()), s, nullptr);
  const Vec dout = random_vec(N * s.out_columns(), 8);
  Vec dqkv(N * s.qkv_columns()), slots(shardlm::cuda_emulated::attention_backward_scratch_bytes(s) / 4);
  shardlm::cuda_emulated::attention_backward(nullptr, dqkv.data(), dout.data(), ConstTypedPtr(qkv.data()),
                                             ConstTypedPtr(out.data()), lse.data(), s, nullptr,
                                             slots.data());
  const int hd = s.head_dim;
  for (int64_t n = 0; n < N; ++n)
    for (int which = 0; which < 2; ++which)
      for (int d = 0; d < hd; ++d) {
        const float* slot = slots.data() + (which * N + n) * s.out_columns() + d;
        float want = slot[0];
        for (int h = 1; h < s.n_head; ++h) want += slot[h * hd];
        ASSERT_EQ(dqkv[n * s.qkv_columns() + (s.n_head + which) * hd + d], want) << n << " " << d;
      }
  // Without scratch a GQA call is refused (it would write nowhere).
  EXPECT_THROW(shardlm::cuda_emulated::attention_backward(nullptr, dqkv.data(), dout.data(),
                                                          ConstTypedPtr(qkv.data()), ConstTypedPtr(out.data()),
                                                          lse.data(), s, nullptr, nullptr),
               shardlm::Error);
}

// Tiles: 64 rows for head_dim <= 64, 32 rows above. T values make partial tiles, one,
// two and three tiles; documents start inside tiles and on a tile's first row, and the
// late documents leave whole (query tile, key tile) pairs masked (the skip paths).
const AttentionCase kAttentionCases[] = {
    {2, 70, 2, 2, 64, DType::fp32, {}, 2e-6},
    {1, 1, 2, 1, 64, DType::fp32, {}, 2e-6},
    {2, 70, 4, 2, 64, DType::fp32, {5, 37, 64}, 2e-6},
    {1, 150, 2, 1, 64, DType::fp32, {37, 100, 140}, 2e-6},
    {1, 45, 2, 1, 128, DType::fp32, {32, 40}, 2e-6},
    {1, 75, 3, 1, 128, DType::fp32, {10}, 2e-6},
    {1, 33, 3, 3, 40, DType::fp32, {}, 2e-6},
    {2, 20, 2, 1, 72, DType::fp32, {7}, 2e-6},
    {1, 13, 2, 2, 13, DType::fp32, {}, 2e-6},
    // One rounding of out: within a unit in the last place of the larger values.
    {2, 70, 4, 2, 64, DType::bf16, {5, 37}, 8e-3},
    {1, 45, 2, 2, 64, DType::bf16, {}, 8e-3},
    {1, 40, 4, 1, 128, DType::fp16, {20}, 1e-3},
};

INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedAttention, ::testing::ValuesIn(kAttentionCases),
                         [](const auto& info) { return case_name(info.param); });

// The KV cache's kernel (attention_forward_cached_kernel) run as host fibers: the new
// queries of positions [past, T) give bitwise the rows the whole-sequence kernel gives
// them (the same key tiles through the same online_softmax_tile), and the CPU's cached
// rows within the storage type's tolerance; pasts inside, at and across a key tile (64
// rows for head_dim 64, 32 for 128), one new row and all of them; q, k and v read from
// separate buffers at their own strides, as a cache holds them; out written whole.
TEST(EmulatedAttention, KvCacheStepGivesTheWholeForwardsRows) {
  struct Case {
    int T, n_head, n_kv_head, head_dim;
    DType dtype;
    std::vector<int> pasts;
    double tolerance;
  };
  const std::vector<Case> cases = {{70, 4, 2, 64, DType::fp32, {0, 1, 63, 64, 65, 69}, 2e-6},
                                   {70, 4, 2, 64, DType::bf16, {0, 64, 69}, 1e-2},
                                   {40, 2, 2, 128, DType::fp16, {0, 31, 32, 39}, 2e-3},
                                   {33, 3, 1, 40, DType::fp32, {0, 32}, 2e-6}};
  for (const Case& c : cases) {
    AttentionShape s;
    s.B = 1;
    s.T = c.T;
    s.n_head = c.n_head;
    s.n_kv_head = c.n_kv_head;
    s.head_dim = c.head_dim;
    const int64_t cols = s.qkv_columns(), out_cols = s.out_columns();
    const int64_t kv_cols = static_cast<int64_t>(s.n_kv_head) * s.head_dim;
    const Vec values = random_vec(c.T * cols, 41 + c.T, 1.5);
    Stored qkv(c.dtype, values);
    Stored whole(c.dtype, c.T * out_cols);
    Vec lse(static_cast<size_t>(c.n_head) * c.T);
    shardlm::cuda_emulated::attention_forward(nullptr, whole.ptr(), lse.data(), qkv.ptr(), s, nullptr);
    // The cache's layout: q rows [T, n_head hd + 5], keys and values [T, kv_cols + 3].
    const int64_t ld_q = out_cols + 5, ld_kv = kv_cols + 3;
    Vec q_values(c.T * ld_q, 0.0f), k_values(c.T * ld_kv, 0.0f), v_values(c.T * ld_kv, 0.0f);
    for (int t = 0; t < c.T; ++t) {
      for (int64_t j = 0; j < out_cols; ++j) q_values[t * ld_q + j] = values[t * cols + j];
      for (int64_t j = 0; j < kv_cols; ++j) {
        k_values[t * ld_kv + j] = values[t * cols + out_cols + j];
        v_values[t * ld_kv + j] = values[t * cols + out_cols + kv_cols + j];
      }
    }
    Stored q(c.dtype, q_values), k(c.dtype, k_values), v(c.dtype, v_values);
    const Vec whole_rows = whole.widened();
    for (const int past : c.pasts) {
      const std::string what = case_name({1, c.T, c.n_head, c.n_kv_head, c.head_dim, c.dtype, {}, 0}) +
                               " past " + std::to_string(past);
      AttentionShape step = s;
      step.T = c.T - past;
      Stored got(c.dtype, step.T * out_cols);  // NaN: every element must be written
      shardlm::cuda_emulated::attention_forward_cached(nullptr, got.ptr(), ConstTypedPtr(q.ptr()).at(past * ld_q),
                                                       ld_q, k.ptr(), v.ptr(), ld_kv, step, past);
      const Vec got_rows = got.widened();
      const Vec want(whole_rows.begin() + past * out_cols, whole_rows.end());
      ASSERT_EQ(got_rows.size(), want.size());
      int differ = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (std::memcmp(&got_rows[i], &want[i], sizeof(float)) != 0 && ++differ <= 3)
          ADD_FAILURE() << what << ": out[" << i << "] = " << got_rows[i] << ", the whole forward's " << want[i];
      EXPECT_EQ(differ, 0) << what;
      Stored cpu(c.dtype, step.T * out_cols);
      shardlm::cpu::attention_forward_cached(cpu.ptr(), ConstTypedPtr(q.ptr()).at(past * ld_q), ld_q, k.ptr(),
                                             v.ptr(), ld_kv, step, past);
      EXPECT_LT(relative_to_max_error(got_rows, cpu.widened()), c.tolerance) << what;
    }
  }
  // Bad calls are refused before any launch.
  std::vector<float> buffer(4096);
  AttentionShape s{2, 4, 2, 2, 8};
  EXPECT_THROW(shardlm::cuda_emulated::attention_forward_cached(nullptr, buffer.data(), buffer.data(), 16,
                                                                buffer.data(), buffer.data(), 16, s, 0),
               shardlm::Error);  // two sequences
  s.B = 1;
  EXPECT_THROW(shardlm::cuda_emulated::attention_forward_cached(nullptr, buffer.data(), buffer.data(), 8,
                                                                buffer.data(), buffer.data(), 16, s, 0),
               shardlm::Error);  // q's stride shorter than its row
  std::vector<uint16_t> half(4096);
  EXPECT_THROW(shardlm::cuda_emulated::attention_forward_cached(
                   nullptr, buffer.data(), buffer.data(), 16, TypedPtr(half.data(), DType::bf16),
                   buffer.data(), 16, s, 0),
               shardlm::Error);  // mixed types
}

TEST(EmulatedAttention, RejectsBadShapesAndMixedTypes) {
  AttentionShape s;
  s.B = 1;
  s.T = 4;
  s.n_head = 3;
  s.n_kv_head = 2;
  s.head_dim = 8;
  Vec buffer(1024);
  EXPECT_THROW(shardlm::cuda_emulated::attention_forward(nullptr, buffer.data(), buffer.data(),
                                                         buffer.data(), s, nullptr),
               shardlm::Error);
  s.n_kv_head = 1;
  s.head_dim = 129;
  EXPECT_THROW(shardlm::cuda_emulated::attention_backward(nullptr, buffer.data(), buffer.data(),
                                                          buffer.data(), buffer.data(),
                                                          buffer.data(), s, nullptr, buffer.data()),
               shardlm::Error);
  s.head_dim = 8;
  std::vector<uint16_t> half(1024);
  EXPECT_THROW(shardlm::cuda_emulated::attention_forward(
                   nullptr, TypedPtr(half.data(), DType::bf16), buffer.data(), buffer.data(), s,
                   nullptr),
               shardlm::Error);
}

// Ring attention's blocks (attention_block.cu) against the CPU's (cpu/attention_block.hpp):
// two blocks of keys of different lengths, each query seeing a range of each (some
// none, some all, some straddling), the forward of each block, their merge in both
// orders, and the backward of each block ADDED to gradients that are not zero. Head
// dims 20, 40 and 128 (lanes past head_dim, one and four chunks a lane), GQA 4:2 and
// 3:3, q read at a row stride wider than its heads, every storage type. Both sides
// compute in fp32 from the same stored values, in different summation orders (a warp's
// butterfly against the CPU's simd sums): agreement to fp32 rounding, bounded at 1e-5
// of each tensor's largest value (an index or mask error is of the order of 1).
TEST(EmulatedAttention, RingBlocksMatchTheCpuKernels) {
  struct Case {
    int B, q_len, kv_len[2], n_head, n_kv_head, head_dim;
  };
  const Case cases[] = {{2, 7, {5, 11}, 4, 2, 40}, {1, 9, {9, 3}, 3, 3, 20}, {2, 5, {6, 4}, 2, 1, 128}};
  for (const Case& c : cases)
    for (DType type : {DType::fp32, DType::bf16, DType::fp16}) {
      shardlm::AttentionBlockShape s[2];
      for (int k = 0; k < 2; ++k) s[k] = {c.B, c.q_len, c.kv_len[k], c.n_head, c.n_kv_head, c.head_dim};
      const int hd = c.head_dim;
      const int64_t q_cols = int64_t(c.n_head) * hd, ld_q = q_cols + 8;
      const int64_t queries = int64_t(c.B) * c.q_len;
      const std::string what = "ring blocks hd " + std::to_string(hd) + " H " + std::to_string(c.n_head) +
                               ":" + std::to_string(c.n_kv_head) + " " + std::string(shardlm::dtype_name(type));
      Stored q(type, random_vec(queries * ld_q, 41 + hd, 1.0));
      Stored kv[2] = {Stored(type, random_vec(int64_t(c.B) * c.kv_len[0] * s[0].kv_columns(), 42 + hd, 1.0)),
                      Stored(type, random_vec(int64_t(c.B) * c.kv_len[1] * s[1].kv_columns(), 43 + hd, 1.0))};
      std::vector<int32_t> ranges[2];
      for (int k = 0; k < 2; ++k)
        for (int64_t i = 0; i < queries; ++i) {
          const int n = c.kv_len[k], first = int((3 * i + k) % (n + 1));
          const int end = i % 4 == 1 ? first : std::min(n, first + 1 + int((5 * i) % (n + 1)));
          ranges[k].push_back(first);
          ranges[k].push_back(end);
        }
      ranges[0][0] = 0, ranges[0][1] = c.kv_len[0];  // the first query sees all of block 0
      const size_t out_n = size_t(queries * q_cols), lse_n = size_t(c.B) * c.n_head * c.q_len;
      Vec out[2][2], lse[2][2];  // [cpu, gpu][block]
      for (int k = 0; k < 2; ++k) {
        for (int side = 0; side < 2; ++side) {
          out[side][k].assign(out_n, 7.0f);
          lse[side][k].assign(lse_n, 7.0f);
        }
        shardlm::cpu::attention_block_forward(out[0][k].data(), lse[0][k].data(), q.ptr(), ld_q,
                                              kv[k].ptr(), s[k], ranges[k].data());
        shardlm::cuda_emulated::attention_block_forward(nullptr, out[1][k].data(), lse[1][k].data(),
                                                        q.ptr(), ld_q, kv[k].ptr(), s[k], ranges[k].data());
        EXPECT_LE(relative_to_max_error(out[1][k], out[0][k]), 1e-5) << what << " forward out, block " << k;
        for (size_t r = 0; r < lse_n; ++r)
          if (std::isinf(lse[0][k][r]))
            EXPECT_EQ(lse[1][k][r], lse[0][k][r]) << what << " lse row " << r << " (no key)";
          else
            EXPECT_NEAR(lse[1][k][r], lse[0][k][r], 1e-5 * (1 + std::fabs(lse[0][k][r]))) << what << " lse row " << r;
      }
      // The merge, both ways round (0 into 1 and 1 into 0).
      for (int into = 0; into < 2; ++into) {
        Vec mo[2] = {out[0][into], out[0][into]}, ml[2] = {lse[0][into], lse[0][into]};
        shardlm::cpu::attention_lse_merge(mo[0].data(), ml[0].data(), out[0][1 - into].data(),
                                          lse[0][1 - into].data(), s[0]);
        shardlm::cuda_emulated::attention_lse_merge(nullptr, mo[1].data(), ml[1].data(),
                                                    out[0][1 - into].data(), lse[0][1 - into].data(), s[0]);
        EXPECT_LE(relative_to_max_error(mo[1], mo[0]), 1e-6) << what << " merged out into " << into;
        EXPECT_LE(relative_to_max_error(ml[1], ml[0]), 1e-6) << what << " merged lse into " << into;
      }
      // The backward of each block with the merged forward, added to nonzero gradients.
      Vec merged = out[0][0], merged_lse = lse[0][0];
      shardlm::cpu::attention_lse_merge(merged.data(), merged_lse.data(), out[0][1].data(), lse[0][1].data(), s[0]);
      Stored stored_out(type, merged);
      const Vec dout = random_vec(int64_t(out_n), 44 + hd, 1.0);
      for (int k = 0; k < 2; ++k) {
        const size_t dkv_n = size_t(int64_t(c.B) * c.kv_len[k] * s[k].kv_columns());
        Vec dq[2] = {random_vec(int64_t(out_n), 45, 0.5), {}}, dkv[2] = {random_vec(int64_t(dkv_n), 46, 0.5), {}};
        dq[1] = dq[0];
        dkv[1] = dkv[0];
        shardlm::cpu::attention_block_backward(dq[0].data(), dkv[0].data(), dout.data(), stored_out.ptr(),
                                               merged_lse.data(), q.ptr(), ld_q, kv[k].ptr(), s[k],
                                               ranges[k].data());
        shardlm::cuda_emulated::attention_block_backward(nullptr, dq[1].data(), dkv[1].data(), dout.data(),
                                                         stored_out.ptr(), merged_lse.data(), q.ptr(), ld_q,
                                                         kv[k].ptr(), s[k], ranges[k].data());
        EXPECT_LE(relative_to_max_error(dq[1], dq[0]), 1e-5) << what << " dq, block " << k;
        EXPECT_LE(relative_to_max_error(dkv[1], dkv[0]), 1e-5) << what << " dkv, block " << k;
      }
    }
  // Bad calls are errors, as on the CPU.
  Vec buffer(4096);
  shardlm::AttentionBlockShape bad{1, 2, 3, 3, 2, 8};
  std::vector<int32_t> range(4, 0);
  EXPECT_THROW(shardlm::cuda_emulated::attention_block_forward(nullptr, buffer.data(), buffer.data(), buffer.data(),
                                                               24, buffer.data(), bad, range.data()),
               shardlm::Error);  // 3 heads over 2 kv heads
  bad.n_kv_head = 1;
  std::vector<uint16_t> half(4096);
  EXPECT_THROW(shardlm::cuda_emulated::attention_block_forward(nullptr, buffer.data(), buffer.data(),
                                                               TypedPtr(half.data(), DType::bf16), 24,
                                                               buffer.data(), bad, range.data()),
               shardlm::Error);  // q bf16, k|v fp32
}

TEST(EmulatedCrossEntropy, LossesAndGradientsMatchADoubleReference) {
  constexpr int V = 1000;
  constexpr int64_t stride = 1003;
  const std::vector<int32_t> targets = {3, -1, 999, 0, V, 517};
  const int64_t rows = static_cast<int64_t>(targets.size());
  const float grad_scale = 0.25f;
  for (const bool want_grad : {true, false}) {
    SCOPED_TRACE(want_grad ? "with gradient" : "loss only");
    Vec logits = random_vec(rows * stride, 5, 3.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = V; j < stride; ++j) logits[r * stride + j] = 12345.0f;  // never touched
    const Vec original = logits;
    Vec losses(rows, std::numeric_limits<float>::quiet_NaN());
    shardlm::cuda_emulated::cross_entropy_rows(nullptr, logits.data(), stride, targets.data(),
                                               rows, V, grad_scale, losses.data(), want_grad);
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE("row " + std::to_string(r));
      const float* x = original.data() + r * stride;
      const float* got = logits.data() + r * stride;
      for (int64_t j = V; j < stride; ++j) ASSERT_EQ(got[j], 12345.0f);
      const int32_t target = targets[r];
      if (target < 0 || target >= V) {
        if (target < 0)
          EXPECT_EQ(losses[r], 0.0f);
        else
          EXPECT_TRUE(std::isnan(losses[r]));
        for (int j = 0; j < V; ++j) ASSERT_EQ(got[j], want_grad ? 0.0f : x[j]);
        continue;
      }
      double max_x = x[0];
      for (int j = 1; j < V; ++j) max_x = std::max(max_x, static_cast<double>(x[j]));
      double sum = 0.0;
      for (int j = 0; j < V; ++j) sum += std::exp(x[j] - max_x);
      const double loss = max_x + std::log(sum) - x[target];
      EXPECT_NEAR(losses[r], loss, 1e-5 * std::fabs(loss) + 1e-6);
      for (int j = 0; j < V; ++j) {
        const double want =
            want_grad ? grad_scale * (std::exp(x[j] - max_x) / sum - (j == target ? 1.0 : 0.0))
                      : x[j];
        ASSERT_NEAR(got[j], want, 1e-6 + 1e-5 * std::fabs(want)) << "column " << j;
      }
    }
  }
}

TEST(EmulatedCrossEntropy, RejectsBadArgumentsAndSkipsEmptyChunks) {
  Vec logits(16);
  Vec losses(2);
  const std::vector<int32_t> targets = {0, 1};
  EXPECT_THROW(shardlm::cuda_emulated::cross_entropy_rows(nullptr, logits.data(), 4, targets.data(),
                                                          2, 8, 1.0f, losses.data(), true),
               shardlm::Error);  // stride < V
  EXPECT_THROW(shardlm::cuda_emulated::cross_entropy_rows(nullptr, logits.data(), 8, targets.data(),
                                                          2, 0, 1.0f, losses.data(), true),
               shardlm::Error);  // V = 0
  shardlm::cuda_emulated::cross_entropy_rows(nullptr, logits.data(), 8, targets.data(), 0, 8,
                                             1.0f, losses.data(), true);  // nothing to do
}

}  // namespace
