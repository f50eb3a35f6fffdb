// The CUDA backend's own kernels (backend/cuda/kernels_elementwise.cu, kernels_reduce.cu,
// kernels_moe.cu)
// compiled as plain C++ and run on host threads (tests/cuda_emulation/include: a block
// is blockDim.x std::threads, __syncthreads a barrier, shuffles an exchange), against
// the cpu:: kernels on the same inputs. It runs in every build, GPU or not, and checks
// what can go wrong without a card: index arithmetic (row strides, heads inside a row,
// grid-stride tails, odd sizes), which tensors are overwritten and which accumulate,
// in-place forms, the storage types' rounding, the chunked column sums and the AdamW
// launch splitting over many decay ranges. What it cannot check (the real intrinsics,
// cuBLASLt, speed, races the barriers would not expose) is left to test_backend_ops on
// a GPU.
//
// Tolerances as in test_backend_ops.cpp: 1e-5 relative for fp32 results whose sums run
// in another order; exact where both sides add the same values in the same order.
#include <gtest/gtest.h>

#ifndef SHARDLM_CUDA_EMULATION

TEST(BackendKernelsEmulated, Unavailable) {
  GTEST_SKIP() << "tests/cuda_emulation is not in this checkout: the CUDA kernels cannot run "
                  "on host threads here";
}

#else

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_helpers.hpp"
#include "relative_error.hpp"
#include "shardlm/backend/backend.hpp"
#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/embedding.hpp"
#include "shardlm/backend/cpu/gelu.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/cpu/moe.hpp"
#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/backend/cpu/rmsnorm.hpp"
#include "shardlm/backend/cpu/rope.hpp"
#include "shardlm/backend/cpu/swiglu.hpp"
#include "shardlm/backend/cpu/vocab_shard.hpp"
#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/optim/adamw.hpp"

// The kernels' namespace renamed, so that a CUDA build's real shardlm::cuda functions
// (in shardlm_lib) and these host-thread instances do not collide.
#define cuda cuda_emulated
#include "shardlm/backend/cuda/kernels_elementwise.cu"
#include "shardlm/backend/cuda/kernels_reduce.cu"
#include "shardlm/backend/cuda/kernels_moe.cu"
#undef cuda

namespace {

namespace gpu = shardlm::cuda_emulated::kernels;
using kernel_test::Half;
using kernel_test::random_vec;
using kernel_test::Vec;
using shardlm::DType;
using shardlm::TypedPtr;

constexpr double kFp32Tol = 1e-5;
constexpr cudaStream_t kStream = nullptr;

void expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << what << ": NaN mismatch at " << i;
  const double error = relative_to_max_error(got, want);
  EXPECT_LE(error, tol) << what << ": relative error " << error;
}

// Equal values (NaN where the other has NaN; infinities equal).
void expect_equal_values(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
        << what << " at " << i << ": " << got[i] << " vs " << want[i];
}

// Bitwise equality (NaN payloads included).
void expect_same_bits(const Half& got, const Half& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " at " << i;
}

Vec widen_storage(DType type, const Half& s, size_t n) {
  Vec out(n);
  shardlm::cpu::convert(out.data(), shardlm::ConstTypedPtr(s.data(), type), int64_t(n));
  return out;
}

TEST(BackendKernelsEmulated, Conversions) {
  Vec values = random_vec(1001, 1, 3.0);
  values[0] = 1.0f + std::ldexp(1.0f, -8);  // a bf16 tie
  values[1] = 1.0e6f;                       // beyond fp16
  values[2] = std::numeric_limits<float>::quiet_NaN();
  values[3] = -0.0f;
  uint32_t signalling = 0x7f800001u;  // a NaN payload float_to_bf16 quiets its own way
  std::memcpy(&values[4], &signalling, 4);
  for (DType to : {DType::bf16, DType::fp16}) {
    Half got(values.size()), want(values.size());
    ASSERT_EQ(gpu::convert(kStream, TypedPtr(got.data(), to), values.data(), 1001), cudaSuccess);
    shardlm::cpu::convert(TypedPtr(want.data(), to), values.data(), 1001);
    if (to == DType::bf16) {
      expect_same_bits(got, want, "convert fp32 -> bf16");
    } else {
      // fp16 NaN payloads may differ (the CUDA intrinsic's, GCC's _Float16): compare values.
      expect_equal_values(widen_storage(to, got, 1001), widen_storage(to, want, 1001),
                          "convert fp32 -> fp16");
    }
    // And back.
    Vec back(values.size()), back_want(values.size());
    gpu::convert(kStream, back.data(), shardlm::ConstTypedPtr(got.data(), to), 1001);
    shardlm::cpu::convert(back_want.data(), shardlm::ConstTypedPtr(got.data(), to), 1001);
    expect_equal_values(back, back_want, "convert back to fp32");
    // round_to
    Vec rounded(values.size()), rounded_want(values.size());
    gpu::round_to(kStream, to, rounded.data(), values.data(), 1001);
    shardlm::cpu::round_to(to, rounded_want.data(), values.data(), 1001);
    expect_equal_values(rounded, rounded_want, "round_to");
  }
  // convert_rows with strides, padding kept.
  const int rows = 6, cols = 37, ld_src = 40, ld_dst = 39;
  const Vec src = random_vec(size_t(rows) * ld_src, 2);
  Half got(size_t(rows) * ld_dst, 0x1234), want(size_t(rows) * ld_dst, 0x1234);
  gpu::convert_rows(kStream, TypedPtr(got.data(), DType::bf16), ld_dst, src.data(), ld_src, rows,
                    cols);
  shardlm::cpu::convert_rows(TypedPtr(want.data(), DType::bf16), ld_dst, src.data(), ld_src, rows,
                             cols);
  expect_same_bits(got, want, "convert_rows");
  // scale_rows (a GEMM with K = 0): beta 0 ignores NaN.
  Vec c(size_t(rows) * ld_src, std::nanf(""));
  gpu::scale_rows(kStream, c.data(), ld_src, rows, cols, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < ld_src; ++k)
      EXPECT_EQ(std::isnan(c[size_t(r) * ld_src + k]), k >= cols) << r << " " << k;
}

TEST(BackendKernelsEmulated, BiasGeluSwiglu) {
  const int64_t N = 5;
  const int M = 300;  // more than a block of 256 per row
  const Vec x = random_vec(N * M, 11, 2.0), y = random_vec(N * M, 12), bias = random_vec(M, 13);
  {
    Vec got = x, want = x;
    gpu::add_bias_inplace(kStream, got.data(), bias.data(), N, M);
    shardlm::cpu::add_bias(want.data(), bias.data(), N, M);
    EXPECT_EQ(got, want);
    Half got16(N * M), want16(N * M);
    gpu::add_bias(kStream, TypedPtr(got16.data(), DType::bf16), x.data(), bias.data(), N, M);
    shardlm::cpu::add_bias(TypedPtr(want16.data(), DType::bf16), x.data(), bias.data(), N, M);
    expect_same_bits(got16, want16, "add_bias bf16");
    Vec acc = x, acc_want = x;
    gpu::accumulate(kStream, acc.data(), y.data(), N * M);
    shardlm::cpu_backend().accumulate(acc_want.data(), y.data(), N * M);
    EXPECT_EQ(acc, acc_want);
    Vec r(N * M), r_want(N * M);
    for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
      gpu::residual_add_bias(kStream, r.data(), x.data(), y.data(), b, N, M);
      shardlm::cpu::residual_add_bias(r_want.data(), x.data(), y.data(), b, N, M);
      EXPECT_EQ(r, r_want);
    }
  }
  for (int64_t rows : {int64_t(3), int64_t(600)}) {  // one chunk, three chunks of 256
    const Vec dout = random_vec(rows * M, 14), dbias0 = random_vec(M, 15);
    Vec got = dbias0, want = dbias0;
    std::vector<double> partials(gpu::column_sum_partial_bytes(rows, M, 1) / sizeof(double));
    gpu::bias_backward(kStream, got.data(), dout.data(), rows, M, partials.data());
    shardlm::cpu::bias_backward(want.data(), dout.data(), rows, M);
    expect_close(got, want, kFp32Tol, "bias_backward rows " + std::to_string(rows));
  }
  for (DType type : {DType::fp32, DType::bf16}) {
    Half out(2 * N * M + 1), pre(2 * N * M + 1), out_w(2 * N * M + 1), pre_w(2 * N * M + 1);
    gpu::bias_gelu_forward(kStream, TypedPtr(out.data(), type), TypedPtr(pre.data(), type),
                           x.data(), bias.data(), N, M);
    shardlm::cpu::bias_gelu_forward(TypedPtr(out_w.data(), type), TypedPtr(pre_w.data(), type),
                                    x.data(), bias.data(), N, M);
    expect_equal_values(widen_storage(type, pre, N * M), widen_storage(type, pre_w, N * M),
                        "gelu pre");
    expect_close(widen_storage(type, out, N * M), widen_storage(type, out_w, N * M),
                 type == DType::fp32 ? kFp32Tol : 1e-2, "gelu out");
    Vec dinp(N * M), dinp_w(N * M);
    gpu::gelu_backward(kStream, dinp.data(), y.data(), shardlm::ConstTypedPtr(pre.data(), type),
                       N * M);
    shardlm::cpu::gelu_backward(dinp_w.data(), y.data(), shardlm::ConstTypedPtr(pre.data(), type),
                                N * M);
    expect_close(dinp, dinp_w, kFp32Tol, "gelu backward");
  }
  // SwiGLU: [N, 2I] gate | up; in place for fp32.
  const int I = M / 2;
  for (DType type : {DType::fp32, DType::bf16}) {
    Half h(N * I * 2 + 1), stored(2 * N * 2 * I + 1), h_w(N * I * 2 + 1),
        stored_w(2 * N * 2 * I + 1);
    gpu::swiglu_forward(kStream, TypedPtr(h.data(), type), TypedPtr(stored.data(), type), x.data(),
                        N, I);
    shardlm::cpu::swiglu_forward(TypedPtr(h_w.data(), type), TypedPtr(stored_w.data(), type),
                                 x.data(), N, I);
    expect_equal_values(widen_storage(type, stored, N * 2 * I),
                        widen_storage(type, stored_w, N * 2 * I), "swiglu stored gate_up");
    expect_close(widen_storage(type, h, N * I), widen_storage(type, h_w, N * I),
                 type == DType::fp32 ? kFp32Tol : 1e-2, "swiglu h");
    Vec dgu(N * 2 * I), dgu_w(N * 2 * I);
    const Vec dh = random_vec(N * I, 16);
    gpu::swiglu_backward(kStream, dgu.data(), dh.data(),
                         shardlm::ConstTypedPtr(stored.data(), type), N, I);
    shardlm::cpu::swiglu_backward(dgu_w.data(), dh.data(),
                                  shardlm::ConstTypedPtr(stored.data(), type), N, I);
    expect_close(dgu, dgu_w, kFp32Tol, "swiglu backward");
  }
}

TEST(BackendKernelsEmulated, LayerNorm) {
  const int64_t N = 11;  // one warp per row: 8 rows per block, a partial second block
  const int C = 70;
  const Vec inp = random_vec(N * C, 21, 2.0, 0.3), w = random_vec(C, 22, 0.5, 1.0);
  const Vec b = random_vec(C, 23), branch = random_vec(N * C, 24), bb = random_vec(C, 25);
  const Vec dout = random_vec(N * C, 26);
  Vec out(N * C), mean(N), rstd(N), out_w(N * C), mean_w(N), rstd_w(N);
  gpu::layernorm_forward(kStream, out.data(), mean.data(), rstd.data(), nullptr, inp.data(),
                         nullptr, nullptr, w.data(), b.data(), N, C, shardlm::cpu::kLayerNormEps);
  shardlm::cpu::layernorm_forward(out_w.data(), mean_w.data(), rstd_w.data(), inp.data(), w.data(),
                                  b.data(), N, C);
  expect_close(out, out_w, kFp32Tol, "layernorm out");
  expect_close(mean, mean_w, kFp32Tol, "layernorm mean");
  expect_close(rstd, rstd_w, kFp32Tol, "layernorm rstd");
  Vec res(N * C), res_w(N * C);
  gpu::layernorm_forward(kStream, out.data(), mean.data(), rstd.data(), res.data(), inp.data(),
                         branch.data(), bb.data(), w.data(), b.data(), N, C,
                         shardlm::cpu::kLayerNormEps);
  shardlm::cpu::residual_layernorm_forward(res_w.data(), out_w.data(), mean_w.data(), rstd_w.data(),
                                           inp.data(), branch.data(), bb.data(), w.data(), b.data(),
                                           N, C);
  EXPECT_EQ(res, res_w);
  expect_close(out, out_w, kFp32Tol, "residual layernorm out");
  // Backward accumulates.
  Vec dinp = random_vec(N * C, 27), dw = random_vec(C, 28), db = random_vec(C, 29);
  Vec dinp_w = dinp, dw_w = dw, db_w = db;
  std::vector<double> partials(gpu::column_sum_partial_bytes(N, C, 2) / sizeof(double));
  // (at the residual forward's input and statistics)
  gpu::layernorm_backward_input(kStream, dinp.data(), dout.data(), res_w.data(), w.data(),
                                mean_w.data(), rstd_w.data(), N, C);
  gpu::layernorm_backward_params(kStream, dw.data(), db.data(), dout.data(), res_w.data(),
                                 mean_w.data(), rstd_w.data(), N, C, partials.data());
  shardlm::cpu::layernorm_backward(dinp_w.data(), dw_w.data(), db_w.data(), dout.data(),
                                   res_w.data(), w.data(), mean_w.data(), rstd_w.data(), N, C);
  expect_close(dinp, dinp_w, kFp32Tol, "layernorm dinp");
  expect_close(dw, dw_w, kFp32Tol, "layernorm dweight");
  expect_close(db, db_w, kFp32Tol, "layernorm dbias");
}

TEST(BackendKernelsEmulated, RmsNorm) {
  const float eps = 1e-6f;
  struct Case {
    shardlm::RmsNormShape shape;
    int64_t ld;
  };
  // Plain; per head inside a wider row; more vectors than one column-sum chunk.
  for (const Case& k :
       {Case{{9, 1, 100}, 100}, Case{{3, 4, 40}, 7 * 40 + 3}, Case{{130, 2, 24}, 50}})
    for (DType type : {DType::fp32, DType::bf16})
      for (bool accumulate : {false, true}) {
        const shardlm::RmsNormShape& s = k.shape;
        const int64_t total = s.rows * k.ld, vectors = s.rows * s.heads;
        const std::string what = "rmsnorm heads " + std::to_string(s.heads) + " " +
                                 std::string(shardlm::dtype_name(type));
        const Vec x_values = random_vec(total, 31, 2.0);
        Half x(2 * total + 1);
        shardlm::cpu::convert(TypedPtr(x.data(), type), x_values.data(), total);
        const shardlm::ConstTypedPtr xp(x.data(), type);
        const Vec w = random_vec(s.dim, 32, 0.5, 1.0), dy = random_vec(total, 33);
        Half y(2 * total + 1, 0), y_w(2 * total + 1, 0);
        Vec rstd(vectors), rstd_w(vectors);
        gpu::rmsnorm_forward(kStream, TypedPtr(y.data(), type), k.ld, rstd.data(), xp, k.ld,
                             w.data(), s, eps);
        shardlm::cpu::rmsnorm_forward(TypedPtr(y_w.data(), type), k.ld, rstd_w.data(), xp, k.ld,
                                      w.data(), s, eps);
        expect_close(widen_storage(type, y, total), widen_storage(type, y_w, total),
                     type == DType::fp32 ? kFp32Tol : 1e-2, what + " y");
        expect_close(rstd, rstd_w, kFp32Tol, what + " rstd");
        Vec dx = random_vec(total, 34), dw = random_vec(s.dim, 35);
        Vec dx_w = dx, dw_w = dw;
        std::vector<double> partials(gpu::column_sum_partial_bytes(vectors, s.dim, 1) /
                                     sizeof(double));
        gpu::rmsnorm_backward_input(kStream, dx.data(), k.ld, dy.data(), k.ld, xp, k.ld, w.data(),
                                    rstd_w.data(), s, accumulate);
        gpu::rmsnorm_backward_weight(kStream, dw.data(), dy.data(), k.ld, xp, k.ld, rstd_w.data(),
                                     s, partials.data());
        shardlm::cpu::rmsnorm_backward(dx_w.data(), k.ld, dw_w.data(), dy.data(), k.ld, xp, k.ld,
                                       w.data(), rstd_w.data(), s, accumulate);
        expect_close(dx, dx_w, kFp32Tol, what + " dx");
        expect_close(dw, dw_w, kFp32Tol, what + " dweight");
      }
  // Residual form.
  const int64_t N = 10;
  const int C = 90;
  const Vec a = random_vec(N * C, 36), br = random_vec(N * C, 37), bb = random_vec(C, 38);
  const Vec w = random_vec(C, 39, 0.5, 1.0);
  Vec res(N * C), res_w(N * C), y(N * C), y_w(N * C), rstd(N), rstd_w(N);
  gpu::residual_rmsnorm_forward(kStream, res.data(), y.data(), rstd.data(), a.data(), br.data(),
                                bb.data(), w.data(), N, C, eps);
  shardlm::cpu::residual_rmsnorm_forward(res_w.data(), y_w.data(), rstd_w.data(), a.data(),
                                         br.data(), bb.data(), w.data(), N, C, eps);
  EXPECT_EQ(res, res_w);
  expect_close(y, y_w, kFp32Tol, "residual rmsnorm y");
  expect_close(rstd, rstd_w, kFp32Tol, "residual rmsnorm rstd");
}

TEST(BackendKernelsEmulated, RopeEmbeddingNf4) {
  const int head_dim = 24, heads = 3, max_positions = 20;
  const int64_t rows = 5, ld_x = heads * head_dim + 4, ld_y = heads * head_dim + 1;
  const shardlm::cpu::RopeTable table(head_dim, max_positions, 10000.0, shardlm::RopeScaling{});
  const std::vector<int32_t> positions = {0, 19, 3, 3, 7};
  const Vec x = random_vec(rows * ld_x, 41);
  for (DType type : {DType::fp32, DType::bf16}) {
    Half y(2 * rows * ld_y + 1, 0), y_w(2 * rows * ld_y + 1, 0);
    gpu::rope_rotate(kStream, TypedPtr(y.data(), type), ld_y, x.data(), ld_x, rows, heads, head_dim,
                     positions.data(), table.view(), 1.0f);
    shardlm::cpu::rope_forward(TypedPtr(y_w.data(), type), ld_y, x.data(), ld_x, rows, heads,
                               head_dim, positions.data(), table.view());
    expect_close(widen_storage(type, y, rows * ld_y), widen_storage(type, y_w, rows * ld_y),
                 type == DType::fp32 ? kFp32Tol : 1e-2, "rope forward");
  }
  Vec dx = x, dx_w = x;  // in place
  gpu::rope_rotate(kStream, dx.data(), ld_x, dx.data(), ld_x, rows, heads, head_dim,
                   positions.data(), table.view(), -1.0f);
  shardlm::cpu::rope_backward(dx_w.data(), ld_x, dx_w.data(), ld_x, rows, heads, head_dim,
                              positions.data(), table.view());
  expect_close(dx, dx_w, kFp32Tol, "rope backward in place");

  // Embeddings: repeated tokens, packed positions, bf16 tables read as bf16 values.
  const int B = 2, T = 4, C = 40, vocab = 6;
  const std::vector<int32_t> tokens = {1, 5, 1, 1, 0, 5, 2, 1};
  const std::vector<int32_t> packed = {0, 1, 0, 1, 2, 3, 0, 1};
  const Vec wte = random_vec(size_t(vocab) * C, 42), wpe = random_vec(size_t(T) * C, 43);
  const Vec dout = random_vec(size_t(B) * T * C, 44);
  for (const int32_t* pos : {static_cast<const int32_t*>(nullptr), packed.data()})
    for (DType value_type : {DType::fp32, DType::bf16}) {
      Vec out(size_t(B) * T * C), out_w(size_t(B) * T * C);
      gpu::embedding_forward(kStream, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                             value_type, pos);
      shardlm::cpu::embedding_forward(out_w.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                                      value_type, pos);
      EXPECT_EQ(out, out_w);
      Vec dwte = wte, dwpe = wpe, dwte_w = wte, dwpe_w = wpe;
      std::vector<int32_t> order(2 * size_t(B) * T);
      gpu::embedding_backward(kStream, dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T,
                              C, pos, order.data());
      shardlm::cpu::embedding_backward(dwte_w.data(), dwpe_w.data(), dout.data(), tokens.data(), B,
                                       T, C, pos);
      EXPECT_EQ(dwte, dwte_w);  // same additions in the same order: bit for bit
      EXPECT_EQ(dwpe, dwpe_w);
    }

  // A larger batch: many repeats of few tokens (runs longer than a rank tile of 256, so the
  // stable order crosses tiles), packed positions, a column count that is not a multiple
  // of the 256-column blocks. The CPU's order of additions, so bit for bit.
  {
    const int B2 = 3, T2 = 120, C2 = 300, vocab2 = 9;
    std::vector<int32_t> tok2(size_t(B2) * T2), pos2(size_t(B2) * T2);
    for (size_t n = 0; n < tok2.size(); ++n) {
      tok2[n] = static_cast<int32_t>((n * 7 + n / 13) % vocab2);
      pos2[n] = static_cast<int32_t>(n % 40);  // documents of 40 rows
    }
    const Vec wte2 = random_vec(size_t(vocab2) * C2, 46), wpe2 = random_vec(size_t(T2) * C2, 47);
    const Vec dout2 = random_vec(size_t(B2) * T2 * C2, 48);
    for (const int32_t* pos : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(pos2.data())}) {
      Vec dwte = wte2, dwpe = wpe2, dwte_w = wte2, dwpe_w = wpe2;
      std::vector<int32_t> order(2 * tok2.size());
      gpu::embedding_backward(kStream, dwte.data(), dwpe.data(), dout2.data(), tok2.data(), B2, T2,
                              C2, pos, order.data());
      shardlm::cpu::embedding_backward(dwte_w.data(), dwpe_w.data(), dout2.data(), tok2.data(), B2,
                                       T2, C2, pos);
      EXPECT_EQ(dwte, dwte_w) << (pos ? "packed" : "default positions");
      EXPECT_EQ(dwpe, dwpe_w) << (pos ? "packed" : "default positions");
      // The order is the stable sort of the tokens (the same as std::stable_sort's).
      std::vector<int32_t> want(tok2.size());
      for (size_t n = 0; n < want.size(); ++n) want[n] = static_cast<int32_t>(n);
      std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return tok2[a] < tok2[b]; });
      EXPECT_EQ(std::vector<int32_t>(order.begin(), order.begin() + long(want.size())), want);
    }
  }

  // NF4, an odd count (a half-filled last byte).
  const int64_t n = 201;
  const Vec values = random_vec(size_t(n), 45);
  std::vector<uint32_t> words(size_t(shardlm::cpu::nf4_storage_words(n)));
  shardlm::cpu::nf4_quantize(values.data(), n, words.data());
  for (DType type : {DType::fp32, DType::bf16, DType::fp16}) {
    Half got(2 * n + 1), want(2 * n + 1);
    gpu::nf4_dequantize(kStream, words.data(), n, TypedPtr(got.data(), type));
    shardlm::cpu::nf4_dequantize(words.data(), n, TypedPtr(want.data(), type));
    expect_equal_values(widen_storage(type, got, n), widen_storage(type, want, n), "nf4");
  }
}

// The vocabulary-parallel kernels: 37 rows (five blocks of 8 warps, the last part idle)
// of 75 held columns (lanes striding past 32 twice, a tail) at row stride 80, targets held
// here, held elsewhere and ignored. Masks, maxima and target logits exact; the warp's
// sums add in lane order (1e-5); the numerators and gradients are the same formulas.
TEST(BackendKernelsEmulated, VocabShardKernels) {
  const shardlm::VocabShardRows shard{150, 75};
  const int rows = 37, ld = 80, C = 33;
  std::vector<int32_t> targets(static_cast<size_t>(rows)), tokens(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    targets[size_t(r)] = r % 5 == 0 ? -1 : (r * 37) % 300;  // ~1/4 of them held here
    tokens[size_t(r)] = (r * 53) % 320 - 10;
  }
  targets[1] = 150;
  targets[2] = 224;
  const Vec logits0 = random_vec(size_t(rows) * ld, 141, 6.0);
  const Vec rows0 = random_vec(size_t(rows) * C, 142);
  std::vector<int32_t> local_got(static_cast<size_t>(rows)), local_want(static_cast<size_t>(rows));
  ASSERT_EQ(gpu::vocab_shard_localize(kStream, local_got.data(), tokens.data(), rows, shard), cudaSuccess);
  shardlm::cpu::vocab_shard_localize(local_want.data(), tokens.data(), rows, shard);
  EXPECT_EQ(local_got, local_want);
  Vec masked_got = rows0, masked_want = rows0;
  gpu::vocab_shard_mask_rows(kStream, masked_got.data(), tokens.data(), rows, C, shard);
  shardlm::cpu::vocab_shard_mask_rows(masked_want.data(), tokens.data(), rows, C, shard);
  expect_equal_values(masked_got, masked_want, "vocab_shard_mask_rows");

  Vec max_got(rows), max_want(rows);
  ASSERT_EQ(gpu::vocab_shard_row_max(kStream, max_got.data(), logits0.data(), ld, rows, shard), cudaSuccess);
  shardlm::cpu::vocab_shard_row_max(max_want.data(), logits0.data(), ld, rows, shard);
  expect_equal_values(max_got, max_want, "vocab_shard_row_max");
  Vec group_max = max_want;
  for (int r = 0; r < rows; r += 3) group_max[size_t(r)] += 0.75f;  // another rank's larger one
  Vec numer_got = logits0, numer_want = logits0, sums_got(2 * rows), sums_want(2 * rows);
  ASSERT_EQ(gpu::vocab_shard_softmax_sums(kStream, sums_got.data(), numer_got.data(), ld,
                                          group_max.data(), targets.data(), rows, shard),
            cudaSuccess);
  shardlm::cpu::vocab_shard_softmax_sums(sums_want.data(), numer_want.data(), ld, group_max.data(),
                                         targets.data(), rows, shard);
  expect_close(numer_got, numer_want, 1e-6, "vocab_shard_softmax_sums numerators");
  Vec sum_got(rows), sum_want(rows), target_got(rows), target_want(rows);
  for (int r = 0; r < rows; ++r) {
    sum_got[size_t(r)] = sums_got[size_t(2 * r)];
    sum_want[size_t(r)] = sums_want[size_t(2 * r)];
    target_got[size_t(r)] = sums_got[size_t(2 * r + 1)];
    target_want[size_t(r)] = sums_want[size_t(2 * r + 1)];
  }
  expect_close(sum_got, sum_want, kFp32Tol, "vocab_shard_softmax_sums sums");
  expect_equal_values(target_got, target_want, "vocab_shard_softmax_sums target logits");

  Vec loss_got(rows, std::nanf("")), loss_want(rows);
  ASSERT_EQ(gpu::vocab_shard_loss(kStream, loss_got.data(), group_max.data(), sums_want.data(),
                                  targets.data(), rows),
            cudaSuccess);
  shardlm::cpu::vocab_shard_loss(loss_want.data(), group_max.data(), sums_want.data(), targets.data(), rows);
  expect_close(loss_got, loss_want, kFp32Tol, "vocab_shard_loss");
  Vec grad_got = numer_want, grad_want = numer_want;
  ASSERT_EQ(gpu::vocab_shard_softmax_backward(kStream, grad_got.data(), ld, sums_want.data(),
                                              targets.data(), rows, 0.125f, shard),
            cudaSuccess);
  shardlm::cpu::vocab_shard_softmax_backward(grad_want.data(), ld, sums_want.data(), targets.data(),
                                             rows, 0.125f, shard);
  expect_close(grad_got, grad_want, kFp32Tol, "vocab_shard_softmax_backward");
}

TEST(BackendKernelsEmulated, AdamWAndSums) {
  const int64_t n = 3000;
  std::vector<shardlm::ElementRange> ranges;
  for (int64_t begin = 5; begin + 9 < n; begin += 41) ranges.push_back({begin, begin + 9});
  ASSERT_GT(ranges.size(), size_t(2 * gpu::kAdamInlineRanges));  // three launches
  std::vector<gpu::HostRange> host_ranges;
  for (const auto& r : ranges) host_ranges.push_back({r.begin, r.end});
  const Vec grads = random_vec(size_t(n), 51);
  Vec p = random_vec(size_t(n), 52), m = random_vec(size_t(n), 53, 0.1), v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * float(i % 7);
  Vec p_w = p, m_w = m, v_w = v;
  const shardlm::AdamWConfig config;
  const float lr = 1e-3f, multiplier = 0.9f;
  const int64_t step = 5;
  // The constants as CudaBackend::adamw_update computes them (optim/adamw.cpp's).
  const double bias1 = 1.0 - std::pow(double(config.beta1), double(step));
  const double bias2 = 1.0 - std::pow(double(config.beta2), double(step));
  const gpu::AdamConstants plain{1.0f,
                                 multiplier,
                                 config.beta1,
                                 config.beta2,
                                 1.0f - config.beta1,
                                 1.0f - config.beta2,
                                 static_cast<float>(lr / bias1),
                                 static_cast<float>(std::sqrt(bias2)),
                                 config.eps};
  gpu::AdamConstants decayed = plain;
  decayed.decay_factor = 1.0f - lr * config.weight_decay;
  Half rounded(2 * n), rounded_w(2 * n);
  gpu::adamw_update(kStream, p.data(), grads.data(), m.data(), v.data(), n, host_ranges.data(),
                    host_ranges.size(), plain, decayed, TypedPtr(rounded.data(), DType::bf16));
  shardlm::adamw_update(p_w.data(), grads.data(), m_w.data(), v_w.data(), n, ranges, lr, multiplier,
                        step, config, TypedPtr(rounded_w.data(), DType::bf16));
  // The same explicit fmas and IEEE operations on both sides: bit for bit.
  EXPECT_EQ(p, p_w);
  EXPECT_EQ(m, m_w);
  EXPECT_EQ(v, v_w);
  expect_same_bits(rounded, rounded_w, "adamw rounded params");

  // Sums in double (one call: the emulation runs kSumBlocks x 256 host threads).
  std::vector<double> partials(gpu::kSumBlocks + 1);
  gpu::sum(kStream, grads.data(), n, true, partials.data(), &partials[gpu::kSumBlocks]);
  EXPECT_NEAR(partials[gpu::kSumBlocks], shardlm::sum_of_squares(grads.data(), n),
              1e-12 * double(n));
}

// The mixture-of-experts kernels: 6 tokens, top-2 of 4 experts, grouped by expert (a
// token's rows scattered back in assignment order, columns over several blocks).
TEST(BackendKernelsEmulated, MixtureOfExperts) {
  const int n = 6, E = 4, k = 2;
  const int64_t width = 300, I = 19;
  std::vector<int32_t> top_expert, token, slot;
  for (int t = 0; t < n; ++t) {
    top_expert.push_back(t % E);
    top_expert.push_back((t + 1 + t % 2) % E);
  }
  kernel_test::group_by_expert(top_expert, n, E, k, token, slot);
  const int64_t rows = int64_t(token.size());
  Vec probs = random_vec(size_t(n) * E, 301, 0.2, 0.25);
  const Vec top_weight = random_vec(size_t(n) * k, 302, 0.3, 0.5);
  // gather (fp32 and bf16 storage: copies, exact)
  const Vec src = random_vec(size_t(n) * width, 303);
  Vec got(static_cast<size_t>(rows) * width), want(static_cast<size_t>(rows) * width);
  gpu::gather_rows(kStream, TypedPtr(got.data()), shardlm::ConstTypedPtr(src.data()), token.data(), rows, width);
  shardlm::cpu::gather_rows(TypedPtr(want.data()), shardlm::ConstTypedPtr(src.data()), token.data(), rows, width);
  expect_equal_values(got, want, "gather_rows fp32");
  Half half_src(static_cast<size_t>(n) * width), half_got(static_cast<size_t>(rows) * width), half_want(static_cast<size_t>(rows) * width);
  for (size_t i = 0; i < half_src.size(); ++i) half_src[i] = uint16_t(i * 2654435761u >> 7);
  gpu::gather_rows(kStream, TypedPtr(half_got.data(), DType::bf16),
                   shardlm::ConstTypedPtr(half_src.data(), DType::bf16), token.data(), rows, width);
  shardlm::cpu::gather_rows(TypedPtr(half_want.data(), DType::bf16),
                            shardlm::ConstTypedPtr(half_src.data(), DType::bf16), token.data(), rows, width);
  expect_same_bits(half_got, half_want, "gather_rows bf16");
  // weights, scatter-add (the same adds in the same order per element: exact)
  Vec w(static_cast<size_t>(rows)), w_want(static_cast<size_t>(rows));
  gpu::moe_assignment_weights(kStream, w.data(), top_weight.data(), token.data(), slot.data(), k, rows);
  shardlm::cpu::moe_assignment_weights(w_want.data(), top_weight.data(), token.data(), slot.data(), k, rows);
  expect_equal_values(w, w_want, "moe_assignment_weights");
  const Vec rows_in = random_vec(size_t(rows) * width, 304);
  for (bool weighted : {true, false}) {
    Vec out = random_vec(size_t(n) * width, 305), out_want = out;
    gpu::scatter_add_rows(kStream, out.data(), rows_in.data(), token.data(), weighted ? w.data() : nullptr, rows, width);
    shardlm::cpu::scatter_add_rows(out_want.data(), rows_in.data(), token.data(), weighted ? w.data() : nullptr, rows, width);
    expect_close(out, out_want, kFp32Tol, weighted ? "scatter_add_rows weighted" : "scatter_add_rows");
  }
  // the top-k weights' gradients
  const Vec act = random_vec(size_t(rows) * I, 306);
  Vec g = random_vec(size_t(rows) * I, 307), g_want = g;
  Vec dy = random_vec(size_t(rows) * width, 308), dy_want = dy;
  Vec dot(static_cast<size_t>(rows)), dot_want(static_cast<size_t>(rows));
  gpu::moe_weight_backward(kStream, dot.data(), g.data(), act.data(), I, dy.data(), width, w.data(), rows);
  shardlm::cpu::moe_weight_backward(dot_want.data(), g_want.data(), act.data(), I, dy_want.data(), width, w.data(), rows);
  expect_close(dot, dot_want, kFp32Tol, "moe_weight_backward dot");
  expect_close(g, g_want, kFp32Tol, "moe_weight_backward g");
  expect_close(dy, dy_want, kFp32Tol, "moe_weight_backward dy");
  Vec dtop = random_vec(size_t(n) * k, 309), dtop_want = dtop;
  gpu::moe_scatter_weight_grads(kStream, dtop.data(), dot_want.data(), token.data(), slot.data(), k, rows);
  shardlm::cpu::moe_scatter_weight_grads(dtop_want.data(), dot_want.data(), token.data(), slot.data(), k, rows);
  expect_equal_values(dtop, dtop_want, "moe_scatter_weight_grads");
  // the router's backward
  const Vec aux = random_vec(size_t(E), 310, 0.1);
  for (bool norm : {true, false}) {
    Vec dl(static_cast<size_t>(n) * E), dl_want(static_cast<size_t>(n) * E);
    gpu::moe_router_backward(kStream, dl.data(), probs.data(), top_expert.data(), dtop.data(), aux.data(), n, E, k, norm);
    shardlm::cpu::moe_router_backward(dl_want.data(), probs.data(), top_expert.data(), dtop.data(), aux.data(), n, E, k, norm);
    expect_close(dl, dl_want, kFp32Tol, norm ? "moe_router_backward norm_topk" : "moe_router_backward");
  }
  // the shared expert's gate
  const Vec z = random_vec(size_t(n), 311, 3.0), out = random_vec(size_t(n) * width, 312);
  Vec gate = z, gate_want = z, y = random_vec(size_t(n) * width, 313), y_want = y;
  gpu::shared_expert_gate_forward(kStream, gate.data(), y.data(), out.data(), n, width);
  shardlm::cpu::shared_expert_gate_forward(gate_want.data(), y_want.data(), out.data(), n, width);
  expect_close(gate, gate_want, kFp32Tol, "shared_expert_gate_forward sigmoid");
  expect_close(y, y_want, kFp32Tol, "shared_expert_gate_forward y");
  Vec dz(static_cast<size_t>(n)), dz_want(static_cast<size_t>(n)), ds(static_cast<size_t>(n) * width), ds_want(static_cast<size_t>(n) * width);
  gpu::shared_expert_gate_backward(kStream, dz.data(), ds.data(), dy_want.data(), gate_want.data(), out.data(), n, width);
  shardlm::cpu::shared_expert_gate_backward(dz_want.data(), ds_want.data(), dy_want.data(), gate_want.data(), out.data(), n, width);
  expect_close(dz, dz_want, kFp32Tol, "shared_expert_gate_backward dz");
  expect_close(ds, ds_want, kFp32Tol, "shared_expert_gate_backward ds");
}

}  // namespace

#endif  // SHARDLM_CUDA_EMULATION
