// Every entry of the Backend table (backend/backend.hpp) on every backend of this build,
// against the CPU backend on the same seeded inputs, by relative error (max |got - want|
// / max |want|, ggml's test-backend-ops): the CPU backend is the reference, and a
// backend passes when it computes the same contract, not the same bits.
//
// Parametrised over "cpu" and "emulated" (always: the emulated device runs the CPU
// kernels on memory the host may not touch, which checks that every input and output
// goes through the table's copies) and "cuda0" (the first GPU). A CUDA case is
// instantiated in every build and reports itself SKIPPED, with the reason, when the
// build has no CUDA backend or the machine no GPU: never silently absent.
//
// On the CPU backend the comparison with itself is exact by construction, so each op
// family also has an independent check here where it is cheap (a double-precision
// reference written out in the test: GEMM, conversions, bias adds, LayerNorm, RMSNorm,
// RoPE, embeddings, the vocabulary-parallel kernels, sums, NF4, AdamW, the
// mixture-of-experts row movement, top-k weight and router gradients and shared-expert
// gate). The cpu:: kernels have their own reference tests
// besides (tests/unit/test_cpu_kernels.cpp, test_gemm.cpp, test_rmsnorm.cpp,
// test_rope.cpp, test_swiglu.cpp, test_attention_gqa.cpp, test_nf4.cpp, test_adamw.cpp,
// test_compute_type_kernels.cpp); GELU, SwiGLU, attention and the LM head rely on those.
// The CUDA backend's own kernels also run on host threads against the cpu:: kernels in
// every build (test_backend_kernels_emulated.cpp); what only a GPU can check is here.
//
// Tolerances (relative to the tensor's max):
//   kFp32Tol = 1e-5: fp32 outputs. Elementwise kernels run the CPU's formulas in its
//     order (fused multiply-adds may differ: an ulp or two, ~1e-7); reductions (norm
//     statistics, GEMM dot products of K <= 100, softmax sums) differ in summation
//     order, a few fp32 ulps of the largest term (~1e-7..1e-6), with TF32 off (the
//     default; SHARDLM_CUDA_TF32=1 would need ~1e-3). Sums of adds (bias, residual,
//     embedding lookups) and conversions are compared exactly.
//   kHalfTol = 1e-2: outputs stored in bf16 / fp16, or computed from values that were
//     (dlogits rounded to bf16 before the LM head's backward GEMMs): an input a
//     reduction-order ulp away from a rounding boundary may round the other way, one
//     bf16 ulp = 2^-8 = 0.4% of the value; 1e-2 allows that and nothing more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/backend/cpu/rope.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/optim/adamw.hpp"
#include "kernel_test_helpers.hpp"
#include "relative_error.hpp"

namespace {

using namespace kernel_test;
using shardlm::Backend;
using shardlm::ConstTypedPtr;
using shardlm::DType;
using shardlm::TypedPtr;

constexpr double kFp32Tol = 1e-5;
constexpr double kHalfTol = 1e-2;

double tolerance(DType type) { return type == DType::fp32 ? kFp32Tol : kHalfTol; }

// A buffer in one backend's memory.
class Buffer {
 public:
  Buffer(Backend& backend, size_t bytes)
      : backend_(&backend),
        memory_(shardlm::MemCategory::other, std::max<size_t>(bytes, 64), backend.allocator()) {}

  void* data() const { return memory_.data(); }
  float* f32() const { return static_cast<float*>(memory_.data()); }
  int32_t* i32() const { return static_cast<int32_t*>(memory_.data()); }
  TypedPtr typed(DType type) const { return {memory_.data(), type}; }

  // n values of `type` read back, widened to fp32 (exact).
  Vec read(DType type, size_t n) const {
    if (type == DType::fp32) {
      Vec out(n);
      backend_->copy_to_host(out.data(), data(), n * sizeof(float));
      return out;
    }
    Half raw(n);
    backend_->copy_to_host(raw.data(), data(), n * sizeof(uint16_t));
    return widen(type, raw);
  }
  Vec read(size_t n) const { return read(DType::fp32, n); }

 private:
  Backend* backend_;
  shardlm::TrackedBuffer memory_;
};

// The values v stored in `type` (rounded once) in a new buffer of `backend`.
Buffer upload(Backend& backend, const Vec& v, DType type = DType::fp32) {
  Buffer buffer(backend, v.size() * shardlm::dtype_bytes(type));
  if (type == DType::fp32) {
    backend.copy_from_host(buffer.data(), v.data(), v.size() * sizeof(float));
  } else {
    const Half raw = to_half(type, v);
    backend.copy_from_host(buffer.data(), raw.data(), raw.size() * sizeof(uint16_t));
  }
  return buffer;
}
Buffer upload_ints(Backend& backend, const std::vector<int32_t>& v) {
  Buffer buffer(backend, v.size() * sizeof(int32_t));
  backend.copy_from_host(buffer.data(), v.data(), v.size() * sizeof(int32_t));
  return buffer;
}

// v as stored in `type` and widened back (what a kernel reads from a `type` tensor).
Vec rounded(DType type, const Vec& v) {
  return type == DType::fp32 ? v : widen(type, to_half(type, v));
}

void expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_FALSE(std::isnan(got[i]) && !std::isnan(want[i])) << what << ": NaN at " << i;
  const double error = relative_to_max_error(got, want);
  EXPECT_LE(error, tol) << what << ": relative error " << error;
}

const char* kCpu = "cpu";
const char* kEmulated = "emulated";
const char* kCuda = "cuda0";

class BackendOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == kCuda) {
      if (!shardlm::cuda_backend_compiled())
        GTEST_SKIP() << "CUDA backend not compiled in this build (CMake found no nvcc)";
      if (shardlm::cuda_device_count() == 0)
        GTEST_SKIP() << "CUDA backend compiled, but no CUDA device is visible on this machine";
      backend_ = &shardlm::backend_for({shardlm::DeviceKind::cuda, 0});
    } else if (GetParam() == kEmulated) {
      backend_ = &shardlm::backend_for({shardlm::DeviceKind::emulated, 0});
    } else {
      backend_ = &shardlm::cpu_backend();
    }
  }
  Backend& tested() { return *backend_; }
  static Backend& reference() { return shardlm::cpu_backend(); }

 private:
  Backend* backend_ = nullptr;
};

// Runs `run(backend)` (returning the outputs as fp32 vectors) on the tested backend and
// on the CPU reference, and compares output by output.
template <typename Run>
void compare_with_cpu(Backend& tested, Run run, const std::vector<double>& tols,
                      const std::string& what) {
  const std::vector<Vec> got = run(tested);
  const std::vector<Vec> want = run(shardlm::cpu_backend());
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), tols.size());
  for (size_t i = 0; i < got.size(); ++i)
    expect_close(got[i], want[i], tols[i], what + " output " + std::to_string(i));
}

// --- memory movement ---------------------------------------------------------------------------

TEST_P(BackendOps, MemoryMovement) {
  Backend& b = tested();
  const Vec values = random_vec(1000, 1);
  const Buffer a = upload(b, values);
  Buffer c(b, values.size() * sizeof(float));
  b.copy(c.data(), a.data(), values.size() * sizeof(float));
  EXPECT_EQ(c.read(values.size()), values);
  b.fill_zero(c.f32() + 10, 90 * sizeof(float));
  b.synchronize();
  const Vec after = c.read(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(after[i], i >= 10 && i < 100 ? 0.0f : values[i]) << i;
  // Fresh memory is zero (the DeviceAllocator contract).
  const Buffer fresh(b, 4096);
  const Vec zeros = fresh.read(1024);
  EXPECT_TRUE(std::all_of(zeros.begin(), zeros.end(), [](float v) { return v == 0.0f; }));
  EXPECT_EQ(b.allocator().device(), b.device());
  EXPECT_FALSE(b.description().empty());
}

// --- GEMM ---------------------------------------------------------------------------------------

struct GemmCase {
  bool trans_a, trans_b;
  int M, N, K;
  DType a_type, b_type;
  float alpha, beta;
};

// Stored operand [rows, cols] with a padded row stride (ld = cols + 3).
TEST_P(BackendOps, Gemm) {
  const std::vector<GemmCase> cases = {
      {false, false, 7, 13, 29, DType::fp32, DType::fp32, 1.0f, 0.0f},
      {false, true, 7, 13, 29, DType::fp32, DType::fp32, 0.5f, 1.0f},
      {true, false, 17, 5, 64, DType::fp32, DType::fp32, 1.0f, 0.25f},
      {true, true, 9, 33, 3, DType::fp32, DType::fp32, -1.0f, 0.0f},
      {false, true, 16, 64, 96, DType::bf16, DType::bf16, 1.0f, 0.0f},
      {false, false, 7, 13, 29, DType::bf16, DType::bf16, 1.0f, 1.0f},
      {true, false, 11, 8, 40, DType::fp16, DType::fp16, 1.0f, 0.0f},
      {false, true, 7, 13, 29, DType::bf16, DType::fp32, 1.0f, 0.0f},
      {true, true, 5, 6, 7, DType::fp32, DType::fp16, 2.0f, 1.0f},
      {false, false, 4, 5, 0, DType::fp32, DType::fp32, 1.0f, 0.5f},  // K = 0: C = beta C
  };
  for (const GemmCase& g : cases) {
    const std::string what = "gemm " + std::to_string(g.M) + "x" + std::to_string(g.N) + "x" +
                             std::to_string(g.K) + (g.trans_a ? " A^T" : "") +
                             (g.trans_b ? " B^T" : "") + " " +
                             std::string(shardlm::dtype_name(g.a_type)) + "x" +
                             std::string(shardlm::dtype_name(g.b_type));
    const int a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
    const int b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
    const int lda = a_cols + 3, ldb = b_cols + 3, ldc = g.N + 3;
    const Vec A = rounded(g.a_type, random_vec(size_t(a_rows) * lda, 11));
    const Vec B = rounded(g.b_type, random_vec(size_t(b_rows) * ldb, 12));
    Vec C0 = random_vec(size_t(g.M) * ldc, 13);
    // beta == 0 must not read C: NaN garbage there must not reach the result.
    if (g.beta == 0.0f) std::fill(C0.begin(), C0.end(), std::numeric_limits<float>::quiet_NaN());
    auto run = [&](Backend& b) {
      const Buffer a = upload(b, A, g.a_type), bb = upload(b, B, g.b_type);
      const Buffer c = upload(b, C0);
      b.gemm(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, a.typed(g.a_type), lda,
             bb.typed(g.b_type), ldb, g.beta, c.f32(), ldc);
      // The padding columns of C are never written: compare only the M x N values,
      // and check the padding separately.
      const Vec all = c.read(C0.size());
      Vec values, padding;
      for (int m = 0; m < g.M; ++m)
        for (int n = 0; n < ldc; ++n)
          (n < g.N ? values : padding).push_back(all[size_t(m) * ldc + n]);
      return std::vector<Vec>{values, padding};
    };
    // Independent check: the double-precision product of the stored operands.
    const std::vector<Vec> got = run(tested());
    Vec want;
    for (int m = 0; m < g.M; ++m)
      for (int n = 0; n < g.N; ++n) {
        double acc = 0.0;
        for (int k = 0; k < g.K; ++k) {
          const double a = g.trans_a ? A[size_t(k) * lda + m] : A[size_t(m) * lda + k];
          const double b = g.trans_b ? B[size_t(n) * ldb + k] : B[size_t(k) * ldb + n];
          acc += a * b;
        }
        const double c = C0[size_t(m) * ldc + n];
        want.push_back(static_cast<float>(g.alpha * acc + (g.beta != 0.0f ? g.beta * c : 0.0)));
      }
    expect_close(got[0], want, kFp32Tol, what + " vs double reference");
    Vec padding_want;
    for (int m = 0; m < g.M; ++m)
      for (int n = g.N; n < ldc; ++n) padding_want.push_back(C0[size_t(m) * ldc + n]);
    ASSERT_EQ(got[1].size(), padding_want.size());
    for (size_t i = 0; i < padding_want.size(); ++i)
      EXPECT_TRUE(got[1][i] == padding_want[i] ||
                  (std::isnan(got[1][i]) && std::isnan(padding_want[i])))
          << what << ": padding of C written at " << i;
    compare_with_cpu(tested(), run, {kFp32Tol, 0.0}, what);
  }
}

// --- conversions --------------------------------------------------------------------------------

TEST_P(BackendOps, ConvertRoundAndRows) {
  const DType types[] = {DType::fp32, DType::bf16, DType::fp16};
  Vec values = random_vec(1003, 21, 3.0);
  // Ties and specials: a bf16 tie (1 + 2^-8 rounds to even 1), overflow of fp16, NaN.
  values[0] = 1.0f + std::ldexp(1.0f, -8);
  values[1] = 1.0e6f;
  values[2] = std::numeric_limits<float>::quiet_NaN();
  values[3] = -0.0f;
  for (DType from : types)
    for (DType to : types) {
      const std::string what = std::string("convert ") + std::string(shardlm::dtype_name(from)) +
                               " -> " + std::string(shardlm::dtype_name(to));
      const Vec src = rounded(from, values);
      Backend& b = tested();
      const Buffer in = upload(b, src, from);
      Buffer out(b, src.size() * 4);
      b.convert(out.typed(to), in.typed(from), static_cast<int64_t>(src.size()));
      const Vec got = out.read(to, src.size());
      // Independent: each value rounded once with dtype.hpp's scalar rule.
      Vec want(src.size());
      for (size_t i = 0; i < src.size(); ++i) want[i] = shardlm::round_to(to, src[i]);
      for (size_t i = 0; i < src.size(); ++i)
        EXPECT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
            << what << " at " << i << ": " << got[i] << " vs " << want[i];
    }
  // round_to: fp32 values representable in the type.
  for (DType to : types) {
    Backend& b = tested();
    const Buffer in = upload(b, values);
    Buffer out(b, values.size() * 4);
    b.round_to(to, out.f32(), in.f32(), static_cast<int64_t>(values.size()));
    const Vec got = out.read(values.size());
    Vec want(values.size());
    for (size_t i = 0; i < values.size(); ++i) want[i] = shardlm::round_to(to, values[i]);
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
          << "round_to " << shardlm::dtype_name(to) << " at " << i;
  }
  // convert_rows: [5, 9] with strides 12 (source) and 10 (destination); the
  // destination's padding keeps its values.
  for (DType to : types) {
    const int rows = 5, cols = 9, ld_src = 12, ld_dst = 10;
    const Vec src = random_vec(size_t(rows) * ld_src, 22);
    const Vec dst0 = rounded(to, random_vec(size_t(rows) * ld_dst, 23));
    Backend& b = tested();
    const Buffer in = upload(b, src), out = upload(b, dst0, to);
    b.convert_rows(out.typed(to), ld_dst, in.f32(), ld_src, rows, cols);
    const Vec got = out.read(to, dst0.size());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < ld_dst; ++c) {
        const float want = c < cols ? shardlm::round_to(to, src[size_t(r) * ld_src + c])
                                    : dst0[size_t(r) * ld_dst + c];
        EXPECT_EQ(got[size_t(r) * ld_dst + c], want) << "convert_rows row " << r << " col " << c;
      }
  }
}

// --- bias, GELU, SwiGLU ---------------------------------------------------------------------------

TEST_P(BackendOps, BiasAdds) {
  const int64_t N = 7;
  const int M = 37;
  const Vec x = random_vec(N * M, 31), y = random_vec(N * M, 32), bias = random_vec(M, 33);
  for (DType out_type : {DType::fp32, DType::bf16}) {
    auto run = [&](Backend& b) {
      Buffer inplace = upload(b, x);
      const Buffer bias_d = upload(b, bias), y_d = upload(b, y), x_d = upload(b, x);
      b.add_bias(inplace.f32(), bias_d.f32(), N, M);
      Buffer typed_out(b, N * M * 4);
      b.add_bias(typed_out.typed(out_type), x_d.f32(), bias_d.f32(), N, M);
      Buffer res(b, N * M * 4), res_nobias(b, N * M * 4);
      b.residual_add_bias(res.f32(), x_d.f32(), y_d.f32(), bias_d.f32(), N, M);
      b.residual_add_bias(res_nobias.f32(), x_d.f32(), y_d.f32(), nullptr, N, M);
      return std::vector<Vec>{inplace.read(N * M), typed_out.read(out_type, N * M),
                              res.read(N * M), res_nobias.read(N * M)};
    };
    const std::vector<Vec> got = run(tested());
    // Independent: the sums written out (fp32, the same order).
    Vec add(N * M), typed(N * M), res(N * M), res_nobias(N * M);
    for (int64_t n = 0; n < N; ++n)
      for (int m = 0; m < M; ++m) {
        const size_t i = size_t(n * M + m);
        add[i] = x[i] + bias[size_t(m)];
        typed[i] = shardlm::round_to(out_type, add[i]);
        res[i] = x[i] + y[i] + bias[size_t(m)];
        res_nobias[i] = x[i] + y[i];
      }
    EXPECT_EQ(got[0], add);
    EXPECT_EQ(got[1], typed);
    EXPECT_EQ(got[2], res);
    EXPECT_EQ(got[3], res_nobias);
  }
  // accumulate: dst += src.
  {
    auto run = [&](Backend& b) {
      Buffer dst = upload(b, x);
      const Buffer src = upload(b, y);
      b.accumulate(dst.f32(), src.f32(), N * M);
      return std::vector<Vec>{dst.read(N * M)};
    };
    Vec want(N * M);
    for (size_t i = 0; i < want.size(); ++i) want[i] = x[i] + y[i];
    EXPECT_EQ(run(tested())[0], want) << "accumulate";
  }
  // bias_backward accumulates column sums into dbias.
  for (int64_t rows : {int64_t(1), int64_t(300), int64_t(1000)}) {
    const Vec dout = random_vec(rows * M, 34), dbias0 = random_vec(M, 35);
    auto run = [&](Backend& b) {
      const Buffer d = upload(b, dout);
      Buffer dbias = upload(b, dbias0);
      b.bias_backward(dbias.f32(), d.f32(), rows, M);
      return std::vector<Vec>{dbias.read(M)};
    };
    Vec want(M);
    for (int m = 0; m < M; ++m) {
      double acc = 0.0;
      for (int64_t n = 0; n < rows; ++n) acc += dout[size_t(n * M + m)];
      want[size_t(m)] = static_cast<float>(dbias0[size_t(m)] + static_cast<float>(acc));
    }
    expect_close(run(tested())[0], want, kFp32Tol, "bias_backward vs double reference");
    compare_with_cpu(tested(), run, {kFp32Tol}, "bias_backward rows " + std::to_string(rows));
  }
}

TEST_P(BackendOps, GeluForwardBackward) {
  const int64_t N = 5;
  const int M = 67;
  const Vec pre_in = random_vec(N * M, 41, 2.0), bias = random_vec(M, 42), dout = random_vec(N * M, 43);
  for (DType type : {DType::fp32, DType::bf16, DType::fp16}) {
    auto run = [&](Backend& b) {
      const Buffer in = upload(b, pre_in), bias_d = upload(b, bias), dout_d = upload(b, dout);
      Buffer out(b, N * M * 4), pre(b, N * M * 4), dinp(b, N * M * 4), nobias(b, N * M * 4);
      b.bias_gelu_forward(out.typed(type), pre.typed(type), in.f32(), bias_d.f32(), N, M);
      // In place, fp32, without bias.
      Buffer inplace = upload(b, pre_in);
      b.bias_gelu_forward(nobias.f32(), inplace.f32(), inplace.f32(), nullptr, N, M);
      b.gelu_backward(dinp.f32(), dout_d.f32(), pre.typed(type), N * M);
      return std::vector<Vec>{out.read(type, N * M), pre.read(type, N * M), dinp.read(N * M),
                              nobias.read(N * M), inplace.read(N * M)};
    };
    compare_with_cpu(tested(), run,
                     {tolerance(type), tolerance(type), tolerance(type), kFp32Tol, kFp32Tol},
                     std::string("gelu ") + std::string(shardlm::dtype_name(type)));
  }
}

TEST_P(BackendOps, SwigluForwardBackward) {
  const int64_t N = 6;
  const int I = 45;
  const Vec gate_up = random_vec(N * 2 * I, 51, 3.0), dh = random_vec(N * I, 52);
  for (DType type : {DType::fp32, DType::bf16}) {
    auto run = [&](Backend& b) {
      const Buffer in = upload(b, gate_up), dh_d = upload(b, dh);
      Buffer h(b, N * I * 4), stored(b, N * 2 * I * 4), dgate_up(b, N * 2 * I * 4);
      b.swiglu_forward(h.typed(type), stored.typed(type), in.f32(), N, I);
      b.swiglu_backward(dgate_up.f32(), dh_d.f32(), stored.typed(type), N, I);
      return std::vector<Vec>{h.read(type, N * I), stored.read(type, N * 2 * I),
                              dgate_up.read(N * 2 * I)};
    };
    compare_with_cpu(tested(), run, {tolerance(type), tolerance(type), tolerance(type)},
                     std::string("swiglu ") + std::string(shardlm::dtype_name(type)));
  }
}

// --- norms ------------------------------------------------------------------------------------------

TEST_P(BackendOps, LayerNorm) {
  const int64_t N = 9;
  const int C = 75;
  const Vec inp = random_vec(N * C, 61, 2.0, 0.5), weight = random_vec(C, 62, 0.5, 1.0);
  const Vec bias = random_vec(C, 63), dout = random_vec(N * C, 64), branch = random_vec(N * C, 65);
  const Vec branch_bias = random_vec(C, 66), dinp0 = random_vec(N * C, 67);
  const Vec dweight0 = random_vec(C, 68), dbias0 = random_vec(C, 69);
  for (DType type : {DType::fp32, DType::bf16}) {
    auto run = [&](Backend& b) {
      const Buffer in = upload(b, inp), w = upload(b, weight), bi = upload(b, bias);
      const Buffer dy = upload(b, dout), br = upload(b, branch), bb = upload(b, branch_bias);
      Buffer out(b, N * C * 4), mean(b, N * 4), rstd(b, N * 4);
      b.layernorm_forward(out.typed(type), mean.f32(), rstd.f32(), in.f32(), w.f32(), bi.f32(), N,
                          C);
      Buffer residual(b, N * C * 4), out2(b, N * C * 4), mean2(b, N * 4), rstd2(b, N * 4);
      b.residual_layernorm_forward(residual.f32(), out2.typed(type), mean2.f32(), rstd2.f32(),
                                   in.f32(), br.f32(), bb.f32(), w.f32(), bi.f32(), N, C);
      // Gradients accumulate onto what is there.
      Buffer dinp = upload(b, dinp0), dweight = upload(b, dweight0), dbias = upload(b, dbias0);
      b.layernorm_backward(dinp.f32(), dweight.f32(), dbias.f32(), dy.f32(), in.f32(), w.f32(),
                           mean.f32(), rstd.f32(), N, C);
      return std::vector<Vec>{out.read(type, N * C), mean.read(N),       rstd.read(N),
                              residual.read(N * C),  out2.read(type, N * C), mean2.read(N),
                              rstd2.read(N),         dinp.read(N * C),   dweight.read(C),
                              dbias.read(C)};
    };
    const double t = tolerance(type);
    compare_with_cpu(tested(), run,
                     {t, kFp32Tol, kFp32Tol, kFp32Tol, t, kFp32Tol, kFp32Tol, kFp32Tol, kFp32Tol,
                      kFp32Tol},
                     std::string("layernorm ") + std::string(shardlm::dtype_name(type)));
    if (type != DType::fp32) continue;
    // Independent: the forward in double.
    const std::vector<Vec> got = run(tested());
    Vec want(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double mean = 0.0, var = 0.0;
      for (int c = 0; c < C; ++c) mean += inp[size_t(n * C + c)];
      mean /= C;
      for (int c = 0; c < C; ++c) var += std::pow(inp[size_t(n * C + c)] - mean, 2);
      const double rstd = 1.0 / std::sqrt(var / C + shardlm::cpu::kLayerNormEps);
      for (int c = 0; c < C; ++c)
        want[size_t(n * C + c)] = static_cast<float>((inp[size_t(n * C + c)] - mean) * rstd *
                                                         weight[size_t(c)] +
                                                     bias[size_t(c)]);
    }
    expect_close(got[0], want, kFp32Tol, "layernorm forward vs double reference");
  }
}

TEST_P(BackendOps, RmsNorm) {
  const float eps = 1e-6f;
  // A plain [rows, dim] matrix, and Qwen3's per-head norm inside a fused qkv row
  // (3 q heads of 64 at the start of a row of 7 heads plus 5 padding values).
  struct Case {
    shardlm::RmsNormShape shape;
    int64_t ld;
  };
  const Case cases[] = {{{11, 1, 93}, 93}, {{5, 3, 64}, 7 * 64 + 5}, {{300, 1, 40}, 40}};
  for (const Case& k : cases)
    for (DType type : {DType::fp32, DType::bf16}) {
      const shardlm::RmsNormShape& s = k.shape;
      const int64_t total = s.rows * k.ld, vectors = s.rows * s.heads;
      const Vec x = rounded(type, random_vec(total, 71, 2.0));
      const Vec weight = random_vec(s.dim, 72, 0.5, 1.0), dy = random_vec(total, 73);
      const Vec dx0 = random_vec(total, 74), dweight0 = random_vec(s.dim, 75);
      for (bool accumulate : {false, true}) {
        auto run = [&](Backend& b) {
          const Buffer x_d = upload(b, x, type), w = upload(b, weight), dy_d = upload(b, dy);
          Buffer y = upload(b, Vec(total, 0.0f), type), rstd(b, vectors * 4);
          b.rmsnorm_forward(y.typed(type), k.ld, rstd.f32(), x_d.typed(type), k.ld, w.f32(), s,
                            eps);
          Buffer dx = upload(b, dx0), dweight = upload(b, dweight0);
          b.rmsnorm_backward(dx.f32(), k.ld, dweight.f32(), dy_d.f32(), k.ld, x_d.typed(type),
                             k.ld, w.f32(), rstd.f32(), s, accumulate);
          // A frozen weight: no weight gradient (null), dx alone.
          Buffer dx_frozen = upload(b, dx0);
          b.rmsnorm_backward(dx_frozen.f32(), k.ld, nullptr, dy_d.f32(), k.ld, x_d.typed(type),
                             k.ld, w.f32(), rstd.f32(), s, accumulate);
          return std::vector<Vec>{y.read(type, total), rstd.read(vectors), dx.read(total),
                                  dweight.read(s.dim), dx_frozen.read(total)};
        };
        const double t = tolerance(type);
        const std::string what = "rmsnorm " + std::string(shardlm::dtype_name(type)) + " heads " +
                                 std::to_string(s.heads) + (accumulate ? " accumulate" : "");
        compare_with_cpu(tested(), run, {t, kFp32Tol, kFp32Tol, kFp32Tol, kFp32Tol}, what);
        // Independent: the forward in double (padding untouched: y started at zero).
        const std::vector<Vec> got = run(tested());
        Vec want(total, 0.0f);
        for (int64_t v = 0; v < vectors; ++v) {
          const int64_t at = v / s.heads * k.ld + (v % s.heads) * s.dim;
          double sum_sq = 0.0;
          for (int c = 0; c < s.dim; ++c) sum_sq += double(x[size_t(at + c)]) * x[size_t(at + c)];
          const double r = 1.0 / std::sqrt(sum_sq / s.dim + eps);
          for (int c = 0; c < s.dim; ++c)
            want[size_t(at + c)] = static_cast<float>(x[size_t(at + c)] * r * weight[size_t(c)]);
        }
        expect_close(got[0], want, t, what + " forward vs double reference");
      }
    }
  // The residual form.
  const int64_t N = 6;
  const int C = 130;
  const Vec a = random_vec(N * C, 76), branch = random_vec(N * C, 77), bb = random_vec(C, 78);
  const Vec weight = random_vec(C, 79, 0.5, 1.0);
  for (DType type : {DType::fp32, DType::bf16}) {
    auto run = [&](Backend& b) {
      const Buffer a_d = upload(b, a), br = upload(b, branch), bb_d = upload(b, bb),
                   w = upload(b, weight);
      Buffer residual(b, N * C * 4), y(b, N * C * 4), rstd(b, N * 4);
      b.residual_rmsnorm_forward(residual.f32(), y.typed(type), rstd.f32(), a_d.f32(), br.f32(),
                                 bb_d.f32(), w.f32(), N, C, eps);
      Buffer residual2(b, N * C * 4), y2(b, N * C * 4), rstd2(b, N * 4);
      b.residual_rmsnorm_forward(residual2.f32(), y2.typed(type), rstd2.f32(), a_d.f32(),
                                 br.f32(), nullptr, w.f32(), N, C, eps);
      return std::vector<Vec>{residual.read(N * C), y.read(type, N * C), rstd.read(N),
                              residual2.read(N * C), y2.read(type, N * C)};
    };
    const double t = tolerance(type);
    compare_with_cpu(tested(), run, {kFp32Tol, t, kFp32Tol, kFp32Tol, t},
                     "residual_rmsnorm " + std::string(shardlm::dtype_name(type)));
  }
}

// --- RoPE, attention, embeddings ----------------------------------------------------------------

// The host table's cos and sin copied into `backend`'s memory.
struct DeviceRope {
  Buffer values;
  shardlm::RopeTableView view;
  DeviceRope(Backend& b, const shardlm::cpu::RopeTable& table)
      : values(upload(b, Vec(table.data(), table.data() + table.values()))) {
    const int64_t half_values = table.values() / 2;
    view = {values.f32(), values.f32() + half_values, table.head_dim(), table.max_positions()};
  }
};

TEST_P(BackendOps, Rope) {
  const int head_dim = 64, heads = 3, max_positions = 50;
  const int64_t rows = 7, ld_x = heads * head_dim + 6, ld_y = heads * head_dim + 2;
  const shardlm::cpu::RopeTable table(head_dim, max_positions, 10000.0, shardlm::RopeScaling{});
  const std::vector<int32_t> positions = {0, 1, 2, 49, 17, 17, 3};
  const Vec x = random_vec(rows * ld_x, 81), dy = random_vec(rows * ld_x, 82);
  for (DType type : {DType::fp32, DType::bf16}) {
    auto run = [&](Backend& b) {
      const DeviceRope rope(b, table);
      const Buffer x_d = upload(b, x), dy_d = upload(b, dy), pos = upload_ints(b, positions);
      Buffer y = upload(b, Vec(rows * ld_y, 0.0f), type);
      b.rope_forward(y.typed(type), ld_y, x_d.f32(), ld_x, rows, heads, head_dim, pos.i32(),
                     rope.view);
      Buffer dx = upload(b, Vec(rows * ld_y, 0.0f));
      b.rope_backward(dx.f32(), ld_y, dy_d.f32(), ld_x, rows, heads, head_dim, pos.i32(),
                      rope.view);
      // In place (fp32).
      Buffer inplace = upload(b, x);
      b.rope_forward(inplace.f32(), ld_x, inplace.f32(), ld_x, rows, heads, head_dim, pos.i32(),
                     rope.view);
      return std::vector<Vec>{y.read(type, rows * ld_y), dx.read(rows * ld_y),
                              inplace.read(rows * ld_x)};
    };
    compare_with_cpu(tested(), run, {tolerance(type), kFp32Tol, kFp32Tol},
                     "rope " + std::string(shardlm::dtype_name(type)));
    // Independent: the rotation written out (cos and sin from the table), and R^T R = 1.
    const std::vector<Vec> got = run(tested());
    const int half = head_dim / 2;
    Vec want(rows * ld_y, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < half; ++i) {
          const float c = table.cos_row(positions[size_t(r)])[i];
          const float s = table.sin_row(positions[size_t(r)])[i];
          const float a = x[size_t(r * ld_x + h * head_dim + i)];
          const float b2 = x[size_t(r * ld_x + h * head_dim + i + half)];
          want[size_t(r * ld_y + h * head_dim + i)] = shardlm::round_to(type, a * c - b2 * s);
          want[size_t(r * ld_y + h * head_dim + i + half)] = shardlm::round_to(type, b2 * c + a * s);
        }
    expect_close(got[0], want, tolerance(type), "rope forward vs written-out rotation");
  }
}

TEST_P(BackendOps, AttentionGqaWithKeyBegin) {
  // GQA 4:2, head_dim 64; the second sequence packs documents of lengths 5, 1 and 7.
  const shardlm::AttentionShape s{2, 13, 4, 2, 64};
  const int64_t rows = int64_t(s.B) * s.T;
  std::vector<int32_t> key_begin(size_t(rows), 0);
  const int lengths[] = {5, 1, 7};
  int start = 0, t = 0;
  for (int length : lengths) {
    for (int i = 0; i < length; ++i) key_begin[size_t(s.T + t++)] = start;
    start += length;
  }
  const Vec qkv = random_vec(rows * s.qkv_columns(), 91, 1.5 / std::pow(64.0, 0.25));
  const Vec dout = random_vec(rows * s.out_columns(), 92);
  for (DType type : {DType::fp32, DType::bf16})
    for (bool packed : {false, true}) {
      auto run = [&](Backend& b) {
        const Buffer qkv_d = upload(b, qkv, type), dout_d = upload(b, dout);
        const Buffer kb = upload_ints(b, key_begin);
        const int32_t* begin = packed ? kb.i32() : nullptr;
        Buffer out(b, rows * s.out_columns() * 4), lse(b, int64_t(s.B) * s.n_head * s.T * 4);
        b.attention_forward(out.typed(type), lse.f32(), qkv_d.typed(type), s, begin);
        Buffer dqkv = upload(b, Vec(rows * s.qkv_columns(), std::nanf("")));  // overwritten
        b.attention_backward(dqkv.f32(), dout_d.f32(), qkv_d.typed(type), out.typed(type),
                             lse.f32(), s, begin);
        return std::vector<Vec>{out.read(type, rows * s.out_columns()),
                                lse.read(int64_t(s.B) * s.n_head * s.T),
                                dqkv.read(rows * s.qkv_columns())};
      };
      const double t2 = tolerance(type);
      compare_with_cpu(tested(), run, {t2, t2, t2},
                       "attention " + std::string(shardlm::dtype_name(type)) +
                           (packed ? " key_begin" : ""));
    }
}

// A KV cache's step (attention_forward_cached): the new queries of positions [past, T)
// over the keys and values of [0, T) give, on every backend, bitwise the rows the
// whole-sequence forward gives those positions on that backend (GQA, so the CPU's bf16
// runs on its widening path in both), and the CPU's rows within the tolerance. q, k and
// v are read in place from the forward's qkv rows (row stride qkv_columns). Key tiles
// are 64 rows for head_dim 64 and 32 for 128 on CUDA: the cases cross them.
TEST_P(BackendOps, AttentionOverKvCache) {
  struct Case {
    shardlm::AttentionShape s;
    std::vector<int> pasts;
  };
  const std::vector<Case> cases = {{{1, 70, 4, 2, 64}, {0, 63, 65, 69}},
                                   {{1, 40, 2, 1, 128}, {0, 31, 33, 39}},
                                   {{1, 9, 4, 2, 40}, {0, 4, 8}}};
  for (const Case& c : cases)
    for (DType type : {DType::fp32, DType::bf16}) {
      const shardlm::AttentionShape& s = c.s;
      const int64_t cols = s.qkv_columns(), out_cols = s.out_columns();
      const Vec qkv = random_vec(size_t(s.T) * cols, 93 + s.T, 1.5 / std::pow(double(s.head_dim), 0.25));
      for (int past : c.pasts) {
        const std::string what = "attention over a KV cache, T " + std::to_string(s.T) + " hd " +
                                 std::to_string(s.head_dim) + " past " + std::to_string(past) + " " +
                                 std::string(shardlm::dtype_name(type));
        const int fresh = s.T - past;
        auto run = [&](Backend& b) {
          const Buffer qkv_d = upload(b, qkv, type);
          Buffer whole(b, size_t(s.T) * out_cols * 4), lse(b, size_t(s.n_head) * s.T * 4);
          b.attention_forward(whole.typed(type), lse.f32(), qkv_d.typed(type), s, nullptr);
          shardlm::AttentionShape step = s;
          step.T = fresh;
          Buffer cached(b, size_t(fresh) * out_cols * 4);
          const TypedPtr rows = qkv_d.typed(type);
          b.attention_forward_cached(cached.typed(type), rows.at(int64_t(past) * cols), cols,
                                     rows.at(out_cols), rows.at(out_cols + int64_t(s.n_kv_head) * s.head_dim),
                                     cols, step, past);
          const Vec all = whole.read(type, size_t(s.T) * out_cols);
          return std::vector<Vec>{cached.read(type, size_t(fresh) * out_cols),
                                  Vec(all.begin() + int64_t(past) * out_cols, all.end())};
        };
        const std::vector<Vec> got = run(tested());
        EXPECT_EQ(got[0], got[1]) << what << ": the cached rows differ from the whole forward's";
        compare_with_cpu(tested(), run, {tolerance(type), tolerance(type)}, what);
      }
    }
}

// Ring attention's blocks (attention_block_forward / _backward, attention_lse_merge):
// the queries over 14 keys held as two blocks of 6 and 8, each query seeing a range of
// them (some straddle the blocks, some see one block, one sees none), the blocks' results
// merged by their log-sum-exp, against a float64 softmax attention over the whole range
// written out here; the backward of both blocks (with the merged output and lse) against
// its float64 gradient. GQA 4:2, head_dim 40, q read at a row stride wider than its heads.
TEST_P(BackendOps, RingAttentionBlocksMatchFloat64) {
  // Each query's keys [first, end) over the two blocks' keys: [(a q) mod m, ... + 1 +
  // (c q) mod len). The small case fits one tile; the large one spans several query and
  // key tiles (64) with ranges that start and end inside them.
  struct Case {
    int Tq, hd, kv_lens[2], a, m, c, len;
  };
  for (const Case& ring_case : {Case{9, 40, {6, 8}, 2, 11, 5, 9}, Case{150, 64, {100, 90}, 7, 180, 37, 120}}) {
    const int B = 2, Tq = ring_case.Tq, H = 4, KV = 2, hd = ring_case.hd;
    const int kv_lens[2] = {ring_case.kv_lens[0], ring_case.kv_lens[1]}, Tk = kv_lens[0] + kv_lens[1];
    const int64_t ld_q = int64_t(H) * hd + 16, q_cols = int64_t(H) * hd, kv_cols = 2 * int64_t(KV) * hd;
    std::vector<int32_t> first(size_t(B) * Tq), end(size_t(B) * Tq);
    for (int q = 0; q < B * Tq; ++q) {
      first[size_t(q)] = (ring_case.a * q) % ring_case.m;
      end[size_t(q)] = std::min(Tk, first[size_t(q)] + 1 + (ring_case.c * q) % ring_case.len);
    }
    first[3] = end[3] = 4;                       // sees nothing
    first[4] = 0, end[4] = 3;                    // the first block only
    first[5] = kv_lens[0] + 2, end[5] = Tk;      // the second only
    first[Tq + 1] = 0, end[Tq + 1] = Tk;         // every key
    const Vec q = random_vec(size_t(B) * Tq * ld_q, 301, 1.0);
    const Vec dout = random_vec(size_t(B) * Tq * q_cols, 302);
    Vec kv_block[2];
    for (int k = 0; k < 2; ++k) kv_block[k] = random_vec(size_t(B) * kv_lens[k] * kv_cols, 303 + k);
    std::vector<int32_t> ranges[2];
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < B * Tq; ++i) {
        const int offset = k == 0 ? 0 : kv_lens[0];
        ranges[k].push_back(std::clamp(first[size_t(i)] - offset, 0, kv_lens[k]));
        ranges[k].push_back(std::clamp(end[size_t(i)] - offset, 0, kv_lens[k]));
      }
    for (DType type : {DType::fp32, DType::bf16}) {
      const Vec qr = rounded(type, q);
      const Vec kvr[2] = {rounded(type, kv_block[0]), rounded(type, kv_block[1])};
      // key j of row b (0 <= j < 14), column c of k | v
      auto key = [&](int b, int j, int64_t c) {
        const int k = j < kv_lens[0] ? 0 : 1, jj = k == 0 ? j : j - kv_lens[0];
        return double(kvr[k][(size_t(b) * kv_lens[k] + jj) * kv_cols + c]);
      };
      auto run = [&](Backend& be) {
        const Buffer q_d = upload(be, q, type), dout_d = upload(be, dout);
        Buffer kv_d[2] = {upload(be, kv_block[0], type), upload(be, kv_block[1], type)};
        Buffer range_d[2] = {upload_ints(be, ranges[0]), upload_ints(be, ranges[1])};
        const size_t out_n = size_t(B) * Tq * q_cols, lse_n = size_t(B) * H * Tq;
        Buffer out(be, out_n * 4), lse(be, lse_n * 4), bout(be, out_n * 4), blse(be, lse_n * 4);
        shardlm::AttentionBlockShape s[2];
        for (int k = 0; k < 2; ++k) s[k] = {B, Tq, kv_lens[k], H, KV, hd};
        be.attention_block_forward(out.f32(), lse.f32(), q_d.typed(type), ld_q, kv_d[0].typed(type), s[0], range_d[0].i32());
        be.attention_block_forward(bout.f32(), blse.f32(), q_d.typed(type), ld_q, kv_d[1].typed(type), s[1], range_d[1].i32());
        be.attention_lse_merge(out.f32(), lse.f32(), bout.f32(), blse.f32(), s[1]);
        const Vec merged = out.read(out_n);
        const Buffer stored = upload(be, merged, type);  // the output as the model stores it
        Buffer dq = upload(be, Vec(out_n, 0.0f));
        Buffer dkv[2] = {upload(be, Vec(size_t(B) * kv_lens[0] * kv_cols, 0.0f)),
                         upload(be, Vec(size_t(B) * kv_lens[1] * kv_cols, 0.0f))};
        for (int k = 0; k < 2; ++k)
          be.attention_block_backward(dq.f32(), dkv[k].f32(), dout_d.f32(), stored.typed(type), lse.f32(),
                                      q_d.typed(type), ld_q, kv_d[k].typed(type), s[k], range_d[k].i32());
        return std::vector<Vec>{merged, lse.read(lse_n), dq.read(out_n),
                                dkv[0].read(size_t(B) * kv_lens[0] * kv_cols),
                                dkv[1].read(size_t(B) * kv_lens[1] * kv_cols)};
      };
      const std::vector<Vec> got = run(tested());
      // float64: softmax over each query's keys, the gradient of sum(dout . out), D_i from
      // the output as stored (what the kernels read).
      const double scale = 1.0 / std::sqrt(double(hd));
      const Vec stored = rounded(type, got[0]);
      Vec want_out(got[0].size(), 0.0f), want_lse(got[1].size()), want_dq(got[2].size(), 0.0f);
      std::vector<double> dkv_all(size_t(B) * Tk * kv_cols, 0.0);
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < Tq; ++i) {
            const int qi = b * Tq + i, g = h / (H / KV);
            const size_t lse_at = (size_t(b) * H + h) * Tq + i;
            const int f = first[size_t(qi)], e = end[size_t(qi)];
            if (f >= e) {
              want_lse[lse_at] = -std::numeric_limits<float>::infinity();
              continue;
            }
            std::vector<double> p(size_t(e - f));
            double max = -1e300, sum = 0;
            for (int j = f; j < e; ++j) {
              double dot = 0;
              for (int d = 0; d < hd; ++d) dot += double(qr[size_t(qi) * ld_q + h * hd + d]) * key(b, j, int64_t(g) * hd + d);
              p[size_t(j - f)] = dot * scale;
              max = std::max(max, dot * scale);
            }
            for (double& v : p) sum += v = std::exp(v - max);
            for (double& v : p) v /= sum;
            want_lse[lse_at] = float(max + std::log(sum));
            const size_t row = size_t(qi) * q_cols + size_t(h) * hd;
            double D = 0;
            for (int d = 0; d < hd; ++d) D += double(dout[row + d]) * double(stored[row + d]);
            for (int d = 0; d < hd; ++d) {
              double o = 0;
              for (int j = f; j < e; ++j) o += p[size_t(j - f)] * key(b, j, int64_t(KV + g) * hd + d);
              want_out[row + d] = float(o);
            }
            for (int j = f; j < e; ++j) {
              double dp = 0;
              for (int d = 0; d < hd; ++d) dp += double(dout[row + d]) * key(b, j, int64_t(KV + g) * hd + d);
              const double ds = p[size_t(j - f)] * (dp - D) * scale;
              double* dkv_row = dkv_all.data() + (size_t(b) * Tk + j) * kv_cols;
              for (int d = 0; d < hd; ++d) {
                want_dq[row + d] += float(ds * key(b, j, int64_t(g) * hd + d));
                dkv_row[g * hd + d] += ds * double(qr[size_t(qi) * ld_q + h * hd + d]);
                dkv_row[(KV + g) * hd + d] += p[size_t(j - f)] * double(dout[row + d]);
              }
            }
          }
      Vec want_dkv[2];
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < Tk; ++j) {
          const int k = j < kv_lens[0] ? 0 : 1;
          for (int64_t c = 0; c < kv_cols; ++c) want_dkv[k].push_back(float(dkv_all[(size_t(b) * Tk + j) * kv_cols + c]));
        }
      const std::string what = "ring attention blocks, " + std::to_string(Tq) + " queries, " +
                               std::string(shardlm::dtype_name(type));
      for (size_t i = 0; i < want_lse.size(); ++i)
        if (std::isinf(want_lse[i])) {
          EXPECT_TRUE(std::isinf(got[1][i]) && got[1][i] < 0) << what << ": lse " << i;
          want_lse[i] = 0.0f;  // compared above; the relative error needs finite values
        }
      Vec got_lse = got[1];
      for (size_t i = 0; i < got_lse.size(); ++i) if (std::isinf(got_lse[i])) got_lse[i] = 0.0f;
      expect_close(got[0], want_out, kFp32Tol, what + " output");
      expect_close(got_lse, want_lse, kFp32Tol, what + " lse");
      expect_close(got[2], want_dq, kFp32Tol, what + " dq");
      expect_close(got[3], want_dkv[0], kFp32Tol, what + " dk|dv of the first block");
      expect_close(got[4], want_dkv[1], kFp32Tol, what + " dk|dv of the second block");
    }
  }
}

TEST_P(BackendOps, Embedding) {
  const int B = 2, T = 5, C = 70, vocab = 11;
  // Repeated tokens (their gradients add up in token order).
  const std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 7, 7, 1, 3, 2};
  const std::vector<int32_t> positions = {0, 1, 2, 0, 1, 0, 1, 2, 3, 4};  // packed
  const Vec wte = random_vec(size_t(vocab) * C, 101), wpe = random_vec(size_t(T) * C, 102);
  const Vec dout = random_vec(size_t(B) * T * C, 103);
  const Vec dwte0 = random_vec(size_t(vocab) * C, 104), dwpe0 = random_vec(size_t(T) * C, 105);
  for (DType table_type : {DType::fp32, DType::bf16})
    for (DType value_type : {DType::fp32, DType::bf16})
      for (int variant = 0; variant < 3; ++variant) {  // wpe by t, wpe by positions, no wpe
        const bool with_wpe = variant < 2;
        const bool with_positions = variant == 1;
        auto run = [&](Backend& b) {
          const Buffer te = upload(b, wte, table_type), pe = upload(b, wpe, table_type);
          const Buffer tok = upload_ints(b, tokens), pos = upload_ints(b, positions);
          const Buffer dy = upload(b, dout);
          Buffer out(b, size_t(B) * T * C * 4);
          const ConstTypedPtr wpe_ptr = with_wpe ? ConstTypedPtr(pe.typed(table_type))
                                                 : ConstTypedPtr(nullptr, table_type);
          const int32_t* pos_ptr = with_positions ? pos.i32() : nullptr;
          b.embedding_forward(out.f32(), tok.i32(), te.typed(table_type), wpe_ptr, B, T, C,
                              value_type, pos_ptr);
          Buffer dwte = upload(b, dwte0), dwpe = upload(b, dwpe0);
          b.embedding_backward(dwte.f32(), with_wpe ? dwpe.f32() : nullptr, dy.f32(), tok.i32(),
                               B, T, C, pos_ptr);
          return std::vector<Vec>{out.read(size_t(B) * T * C), dwte.read(size_t(vocab) * C),
                                  dwpe.read(size_t(T) * C)};
        };
        const std::string what = "embedding tables " +
                                 std::string(shardlm::dtype_name(table_type)) + " values " +
                                 std::string(shardlm::dtype_name(value_type)) + " variant " +
                                 std::to_string(variant);
        compare_with_cpu(tested(), run, {kFp32Tol, kFp32Tol, kFp32Tol}, what);
        // Independent: lookups and sums written out.
        const std::vector<Vec> got = run(tested());
        const Vec te = rounded(table_type, wte), pe = rounded(table_type, wpe);
        Vec out(size_t(B) * T * C);
        std::vector<double> dwte(dwte0.begin(), dwte0.end()), dwpe(dwpe0.begin(), dwpe0.end());
        for (int n = 0; n < B * T; ++n) {
          const int p = with_positions ? positions[size_t(n)] : n % T;
          for (int c = 0; c < C; ++c) {
            float v = shardlm::round_to(value_type, te[size_t(tokens[size_t(n)] * C + c)]);
            if (with_wpe) v += shardlm::round_to(value_type, pe[size_t(p * C + c)]);
            out[size_t(n * C + c)] = v;
            dwte[size_t(tokens[size_t(n)] * C + c)] += dout[size_t(n * C + c)];
            if (with_wpe) dwpe[size_t(p * C + c)] += dout[size_t(n * C + c)];
          }
        }
        EXPECT_EQ(got[0], out) << what;
        expect_close(got[1], Vec(dwte.begin(), dwte.end()), kFp32Tol, what + " dwte vs double");
        expect_close(got[2], Vec(dwpe.begin(), dwpe.end()), kFp32Tol, what + " dwpe vs double");
      }
}

// --- mixture of experts -----------------------------------------------------------------------------

// A routing of n tokens to E experts, top-k, grouped by expert as moe_routing.hpp does
// (tokens ascending within an expert): the index arrays the MoE kernels read.
struct TestRouting {
  int n = 7, E = 5, k = 2;
  Vec probs, top_weight;
  std::vector<int32_t> top_expert, token, slot;
  TestRouting() {
    probs.assign(size_t(n) * E, 0.0f);
    const Vec logits = random_vec(size_t(n) * E, 201, 2.0);
    for (int t = 0; t < n; ++t) {
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += std::exp(double(logits[size_t(t * E + e)]));
      for (int e = 0; e < E; ++e)
        probs[size_t(t * E + e)] = float(std::exp(double(logits[size_t(t * E + e)])) / sum);
      const int first = (t * 3) % E, second = (t * 3 + 1 + t % 3) % E;  // distinct
      top_expert.push_back(first);
      top_expert.push_back(second);
      top_weight.push_back(probs[size_t(t * E + first)]);
      top_weight.push_back(probs[size_t(t * E + second)]);
    }
    group_by_expert(top_expert, n, E, k, token, slot);
  }
  int64_t assignments() const { return int64_t(token.size()); }
};

TEST_P(BackendOps, MoeGatherAndScatterRows) {
  const TestRouting r;
  const int64_t rows = r.assignments(), width = 37;
  const Vec src = random_vec(size_t(r.n) * width, 211), out0 = random_vec(size_t(r.n) * width, 212);
  const Vec weight = random_vec(size_t(rows), 213);
  for (DType type : {DType::fp32, DType::bf16}) {
    auto run = [&](Backend& b) {
      const Buffer in = upload(b, src, type), index = upload_ints(b, r.token);
      Buffer gathered(b, size_t(rows) * width * 4);
      b.gather_rows(gathered.typed(type), in.typed(type), index.i32(), rows, width);
      return std::vector<Vec>{gathered.read(type, size_t(rows) * width)};
    };
    compare_with_cpu(tested(), run, {0.0}, "gather_rows " + std::string(shardlm::dtype_name(type)));
    // Independent: the rows looked up by hand (a copy: exact).
    const Vec stored = rounded(type, src);
    Vec want;
    for (int32_t t : r.token)
      want.insert(want.end(), stored.begin() + t * width, stored.begin() + (t + 1) * width);
    EXPECT_EQ(run(tested())[0], want) << "gather_rows " << shardlm::dtype_name(type);
  }
  // The scatter-add back: every token's k rows add into its output row.
  const Vec rows_in = random_vec(size_t(rows) * width, 214);
  for (bool weighted : {true, false}) {
    auto run = [&](Backend& b) {
      Buffer out = upload(b, out0);
      const Buffer in = upload(b, rows_in), index = upload_ints(b, r.token), w = upload(b, weight);
      b.scatter_add_rows(out.f32(), in.f32(), index.i32(), weighted ? w.f32() : nullptr, rows,
                         width);
      return std::vector<Vec>{out.read(size_t(r.n) * width)};
    };
    const std::string what = std::string("scatter_add_rows") + (weighted ? " weighted" : "");
    compare_with_cpu(tested(), run, {kFp32Tol}, what);
    std::vector<double> want(out0.begin(), out0.end());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < width; ++c)
        want[size_t(r.token[size_t(i)] * width + c)] +=
            (weighted ? double(weight[size_t(i)]) : 1.0) * rows_in[size_t(i * width + c)];
    expect_close(run(tested())[0], Vec(want.begin(), want.end()), kFp32Tol, what + " vs double");
  }
}

TEST_P(BackendOps, MoeTopKWeightGradients) {
  const TestRouting r;
  const int64_t rows = r.assignments(), I = 45, C = 38;
  const Vec g0 = random_vec(size_t(rows) * I, 221), act = random_vec(size_t(rows) * I, 222);
  const Vec dy0 = random_vec(size_t(rows) * C, 223), dtop0 = random_vec(size_t(r.n) * r.k, 224);
  auto run = [&](Backend& b) {
    const Buffer top = upload(b, r.top_weight), token = upload_ints(b, r.token);
    const Buffer slot = upload_ints(b, r.slot), a = upload(b, act);
    Buffer weight(b, size_t(rows) * 4), dot(b, size_t(rows) * 4);
    Buffer g = upload(b, g0), dy = upload(b, dy0), dtop = upload(b, dtop0);
    b.moe_assignment_weights(weight.f32(), top.f32(), token.i32(), slot.i32(), r.k, rows);
    b.moe_weight_backward(dot.f32(), g.f32(), a.f32(), I, dy.f32(), C, weight.f32(), rows);
    b.moe_scatter_weight_grads(dtop.f32(), dot.f32(), token.i32(), slot.i32(), r.k, rows);
    return std::vector<Vec>{weight.read(size_t(rows)), dot.read(size_t(rows)),
                            g.read(size_t(rows) * I), dy.read(size_t(rows) * C),
                            dtop.read(size_t(r.n) * r.k)};
  };
  compare_with_cpu(tested(), run, {0.0, kFp32Tol, kFp32Tol, kFp32Tol, kFp32Tol},
                   "moe top-k weight gradients");
  // Independent, in double.
  const std::vector<Vec> got = run(tested());
  Vec weight(static_cast<size_t>(rows));
  std::vector<double> dot(static_cast<size_t>(rows)), g(static_cast<size_t>(rows) * I), dy(static_cast<size_t>(rows) * C);
  std::vector<double> dtop(dtop0.begin(), dtop0.end());
  for (int64_t i = 0; i < rows; ++i) {
    const size_t at = size_t(r.token[size_t(i)] * r.k + r.slot[size_t(i)]);
    weight[size_t(i)] = r.top_weight[at];
    for (int64_t j = 0; j < I; ++j) dot[size_t(i)] += double(g0[size_t(i * I + j)]) * act[size_t(i * I + j)];
    for (int64_t j = 0; j < I; ++j) g[size_t(i * I + j)] = double(g0[size_t(i * I + j)]) * weight[size_t(i)];
    for (int64_t j = 0; j < C; ++j) dy[size_t(i * C + j)] = double(dy0[size_t(i * C + j)]) * weight[size_t(i)];
    dtop[at] += dot[size_t(i)];
  }
  EXPECT_EQ(got[0], weight) << "moe_assignment_weights";
  expect_close(got[1], Vec(dot.begin(), dot.end()), kFp32Tol, "moe_weight_backward dot vs double");
  expect_close(got[2], Vec(g.begin(), g.end()), kFp32Tol, "moe_weight_backward g vs double");
  expect_close(got[3], Vec(dy.begin(), dy.end()), kFp32Tol, "moe_weight_backward dy vs double");
  expect_close(got[4], Vec(dtop.begin(), dtop.end()), kFp32Tol, "moe_scatter_weight_grads vs double");
}

TEST_P(BackendOps, MoeRouterBackward) {
  const TestRouting r;
  const Vec dw = random_vec(size_t(r.n) * r.k, 231), aux = random_vec(size_t(r.E), 232, 0.1);
  for (bool norm : {true, false})
    for (bool with_aux : {true, false}) {
      auto run = [&](Backend& b) {
        const Buffer p = upload(b, r.probs), top = upload_ints(b, r.top_expert);
        const Buffer d = upload(b, dw), a = upload(b, aux);
        Buffer dlogits(b, size_t(r.n) * r.E * 4);
        b.moe_router_backward(dlogits.f32(), p.f32(), top.i32(), d.f32(),
                              with_aux ? a.f32() : nullptr, r.n, r.E, r.k, norm);
        return std::vector<Vec>{dlogits.read(size_t(r.n) * r.E)};
      };
      const std::string what = std::string("moe_router_backward") + (norm ? " norm_topk" : "") +
                               (with_aux ? " aux" : "");
      compare_with_cpu(tested(), run, {kFp32Tol}, what);
      // Independent: the chain written out in double (w_j = p_j or p_j / S; softmax).
      std::vector<double> want(size_t(r.n) * r.E);
      for (int t = 0; t < r.n; ++t) {
        std::vector<double> dp(size_t(r.E), 0.0);
        for (int e = 0; e < r.E; ++e) dp[size_t(e)] = with_aux ? aux[size_t(e)] : 0.0;
        double S = 0;
        for (int j = 0; j < r.k; ++j) S += r.probs[size_t(t * r.E + r.top_expert[size_t(t * r.k + j)])];
        for (int j = 0; j < r.k; ++j) {  // d w_j / d p_m for the chosen m
          const int m = r.top_expert[size_t(t * r.k + j)];
          for (int i = 0; i < r.k; ++i) {
            const int q = r.top_expert[size_t(t * r.k + i)];
            const double pq = r.probs[size_t(t * r.E + q)];
            const double dwq_dpm = norm ? ((q == m ? 1.0 : 0.0) / S - pq / (S * S)) : (q == m ? 1.0 : 0.0);
            dp[size_t(m)] += dw[size_t(t * r.k + i)] * dwq_dpm;
          }
        }
        double dot = 0;
        for (int e = 0; e < r.E; ++e) dot += double(r.probs[size_t(t * r.E + e)]) * dp[size_t(e)];
        for (int e = 0; e < r.E; ++e)
          want[size_t(t * r.E + e)] = r.probs[size_t(t * r.E + e)] * (dp[size_t(e)] - dot);
      }
      expect_close(run(tested())[0], Vec(want.begin(), want.end()), kFp32Tol, what + " vs double");
    }
}

TEST_P(BackendOps, SharedExpertGate) {
  const int64_t n = 9, C = 41;
  const Vec z = random_vec(size_t(n), 241, 3.0), out = random_vec(size_t(n) * C, 242);
  const Vec y0 = random_vec(size_t(n) * C, 243), dy = random_vec(size_t(n) * C, 244);
  for (bool add : {true, false}) {
    auto run = [&](Backend& b) {
      Buffer gate = upload(b, z), y = upload(b, y0);
      const Buffer o = upload(b, out), d = upload(b, dy);
      Buffer dz(b, size_t(n) * 4), ds(b, size_t(n) * C * 4);
      b.shared_expert_gate_forward(gate.f32(), add ? y.f32() : nullptr, o.f32(), n, C);
      b.shared_expert_gate_backward(dz.f32(), ds.f32(), d.f32(), gate.f32(), o.f32(), n, C);
      return std::vector<Vec>{gate.read(size_t(n)), y.read(size_t(n) * C), dz.read(size_t(n)),
                              ds.read(size_t(n) * C)};
    };
    const std::string what = std::string("shared expert gate") + (add ? " y +=" : "");
    compare_with_cpu(tested(), run, {kFp32Tol, kFp32Tol, kFp32Tol, kFp32Tol}, what);
    std::vector<double> gate(static_cast<size_t>(n)), y(y0.begin(), y0.end()), dz(static_cast<size_t>(n)), ds(static_cast<size_t>(n) * C);
    for (int64_t t = 0; t < n; ++t) {
      const double g = 1.0 / (1.0 + std::exp(-double(z[size_t(t)])));
      gate[size_t(t)] = g;
      double dot = 0;
      for (int64_t j = 0; j < C; ++j) {
        if (add) y[size_t(t * C + j)] += g * out[size_t(t * C + j)];
        dot += double(dy[size_t(t * C + j)]) * out[size_t(t * C + j)];
        ds[size_t(t * C + j)] = g * dy[size_t(t * C + j)];
      }
      dz[size_t(t)] = dot * g * (1 - g);
    }
    const std::vector<Vec> got = run(tested());
    expect_close(got[0], Vec(gate.begin(), gate.end()), kFp32Tol, what + " sigmoid vs double");
    expect_close(got[1], Vec(y.begin(), y.end()), kFp32Tol, what + " y vs double");
    expect_close(got[2], Vec(dz.begin(), dz.end()), kFp32Tol, what + " dz vs double");
    expect_close(got[3], Vec(ds.begin(), ds.end()), kFp32Tol, what + " ds vs double");
  }
}

// --- loss ------------------------------------------------------------------------------------------

TEST_P(BackendOps, LmHeadCrossEntropy) {
  const int64_t N = 11;
  const int C = 48, V = 37, padded_rows = 40;
  const int64_t stride = 45;  // padded logits rows
  const int chunk_rows = 4;   // three chunks, the last partial
  // Ignored targets, one chunk (rows 4..7) fully ignored.
  const std::vector<int32_t> targets = {3, -1, 36, 0, -1, -1, -1, -1, 5, 12, -1};
  const Vec x = random_vec(N * C, 111), weight = random_vec(size_t(padded_rows) * C, 112, 0.2);
  const Vec dweight0 = random_vec(size_t(padded_rows) * C, 113);
  for (DType type : {DType::fp32, DType::bf16})
    for (bool with_grad : {false, true}) {
      auto run = [&](Backend& b) {
        const Buffer x_d = upload(b, x, type), w = upload(b, weight, type);
        const Buffer tg = upload_ints(b, targets);
        Buffer logits(b, size_t(chunk_rows) * stride * 4), dlogits(b, size_t(chunk_rows) * stride * 4);
        Buffer losses(b, N * 4), dx = upload(b, Vec(N * C, std::nanf(""))),
                                 dweight = upload(b, dweight0);
        shardlm::LmHeadLossArgs args;
        args.x = x_d.typed(type);
        args.weight = w.typed(type);
        args.targets = tg.i32();
        args.N = N;
        args.C = C;
        args.V = V;
        args.grad_scale = 0.125f;
        args.logits_scratch = logits.f32();
        args.dlogits_scratch = dlogits.typed(type);
        args.logits_stride = stride;
        args.chunk_rows = chunk_rows;
        b.lm_head_cross_entropy(args, losses.f32(), with_grad ? dx.f32() : nullptr,
                                with_grad ? dweight.f32() : nullptr);
        std::vector<Vec> out = {losses.read(N)};
        if (with_grad) {
          out.push_back(dx.read(N * C));
          out.push_back(dweight.read(size_t(padded_rows) * C));  // padded rows untouched
        }
        return out;
      };
      const double t = tolerance(type);
      std::vector<double> tols = {kFp32Tol};
      if (with_grad) tols.insert(tols.end(), {t, t});
      compare_with_cpu(tested(), run, tols,
                       "lm head " + std::string(shardlm::dtype_name(type)) +
                           (with_grad ? " with gradients" : " loss only"));
    }
}

// The vocabulary-parallel lookup's and loss's per-row kernels (backend/cpu/vocab_shard.hpp),
// in the order VocabParallelEmbedding / VocabParallelHead call them, on a shard of rows
// [10, 27) of a 23-column logits chunk: targets held here, held elsewhere and ignored.
// "Group" maxima and sums stand in for the collectives' results (another rank's larger
// maximum, its share of the sum). Against the CPU backend (exact for the masks, 1e-5 for
// the sums: lanes in another order on a GPU), then on the tested backend against a
// float64 reference written out here: maxima, target logits and masks exact; the
// numerators and their sums, losses and gradients within 1e-6 of the largest (exp_approx
// is ~2 fp32 ulps, 2.4e-7, and the fp32 sum of 17 positive terms adds ~1e-6 at most).
TEST_P(BackendOps, VocabShardKernels) {
  const shardlm::VocabShardRows shard{10, 17};
  const int rows = 6, ld = 23;
  const std::vector<int32_t> targets = {12, -1, 3, 26, 40, 10};
  const Vec logits0 = random_vec(size_t(rows) * ld, 131, 4.0);
  const Vec group_max_extra = {0.0f, 0.5f, 0.0f, 1.25f, 0.0f, 0.0f};
  const Vec other_sums = {0.0f, 0.0f, 3.5f, 0.0f, 0.0f, 1.5f, 2.0f, -0.75f, 0.25f, 1.0f, 0.0f, 0.0f};
  const float grad_scale = 0.25f;
  const std::vector<int32_t> tokens = {11, 3, 26, 27, 10, -5, 100};
  const int C = 9;
  const Vec table_rows = random_vec(tokens.size() * C, 132);
  auto run = [&](Backend& b) {
    const Buffer tok = upload_ints(b, tokens), tg = upload_ints(b, targets);
    Buffer local(b, tokens.size() * 4), masked = upload(b, table_rows);
    b.vocab_shard_localize(local.i32(), tok.i32(), int64_t(tokens.size()), shard);
    b.vocab_shard_mask_rows(masked.f32(), tok.i32(), int64_t(tokens.size()), C, shard);
    Vec local_tokens(tokens.size());
    std::vector<int32_t> raw(tokens.size());
    b.copy_to_host(raw.data(), local.data(), raw.size() * 4);
    std::copy(raw.begin(), raw.end(), local_tokens.begin());

    Buffer logits = upload(b, logits0), row_max(b, rows * 4), sums(b, 2 * rows * 4);
    b.vocab_shard_row_max(row_max.f32(), logits.f32(), ld, rows, shard);
    const Vec local_max = row_max.read(rows);
    Vec group_max(rows);
    for (int r = 0; r < rows; ++r) group_max[size_t(r)] = local_max[size_t(r)] + group_max_extra[size_t(r)];
    const Buffer gmax = upload(b, group_max);
    b.vocab_shard_softmax_sums(sums.f32(), logits.f32(), ld, gmax.f32(), tg.i32(), rows, shard);
    const Vec local_sums = sums.read(2 * rows), numerators = logits.read(size_t(rows) * ld);
    Vec group_sums(2 * rows);
    for (int i = 0; i < 2 * rows; ++i) group_sums[size_t(i)] = local_sums[size_t(i)] + other_sums[size_t(i)];
    const Buffer gsums = upload(b, group_sums);
    Buffer losses = upload(b, Vec(rows, std::nanf("")));
    b.vocab_shard_loss(losses.f32(), gmax.f32(), gsums.f32(), tg.i32(), rows);
    b.vocab_shard_softmax_backward(logits.f32(), ld, gsums.f32(), tg.i32(), rows, grad_scale, shard);
    return std::vector<Vec>{local_tokens, masked.read(tokens.size() * C), local_max, local_sums,
                            numerators, losses.read(rows), logits.read(size_t(rows) * ld)};
  };
  compare_with_cpu(tested(), run, {0, 0, 0, kFp32Tol, kFp32Tol, kFp32Tol, kFp32Tol},
                   "vocab shard kernels");

  // Independent: float64, written out.
  const std::vector<Vec> got = run(tested());
  auto held = [&](int32_t t) { return t >= shard.begin && t < shard.begin + shard.real; };
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(got[0][i], held(tokens[i]) ? float(tokens[i] - shard.begin) : 0.0f) << i;
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(got[1][i * C + size_t(c)], held(tokens[i]) ? table_rows[i * C + size_t(c)] : 0.0f);
  }
  Vec numerators(size_t(rows) * ld), sums(2 * rows), losses(rows), grads(size_t(rows) * ld);
  for (int r = 0; r < rows; ++r) {
    const float* row = logits0.data() + size_t(r) * ld;
    EXPECT_EQ(got[2][size_t(r)], *std::max_element(row, row + shard.real)) << "row max " << r;
    const double m = double(got[2][size_t(r)] + group_max_extra[size_t(r)]);  // fp32, as run
    const int32_t t = targets[size_t(r)];
    double sum = 0.0;
    for (int j = 0; j < ld; ++j) {
      const double e = j < shard.real ? std::exp(double(row[j]) - m) : double(row[j]);
      numerators[size_t(r) * ld + size_t(j)] = float(e);
      if (j < shard.real) sum += e;
    }
    sums[size_t(2 * r)] = float(sum);
    sums[size_t(2 * r + 1)] = held(t) ? row[t - shard.begin] : 0.0f;
    EXPECT_EQ(got[3][size_t(2 * r + 1)], sums[size_t(2 * r + 1)]) << "target logit " << r;
    const double total = sum + other_sums[size_t(2 * r)];
    const double target_logit = double(sums[size_t(2 * r + 1)]) + other_sums[size_t(2 * r + 1)];
    losses[size_t(r)] = t < 0 ? 0.0f : float(m + std::log(total) - target_logit);
    for (int j = 0; j < ld; ++j) {
      double g = double(row[j]);  // the padding columns stay as they were
      if (j < shard.real)
        g = t < 0 ? 0.0 : grad_scale * (std::exp(double(row[j]) - m) / total -
                                        (held(t) && j == t - shard.begin ? 1.0 : 0.0));
      grads[size_t(r) * ld + size_t(j)] = float(g);
    }
  }
  expect_close(got[3], sums, 1e-6, "vocab shard sums vs double");
  expect_close(got[4], numerators, 1e-6, "vocab shard numerators vs double");
  expect_close(got[5], losses, 1e-6, "vocab shard losses vs double");
  expect_close(got[6], grads, 1e-6, "vocab shard gradients vs double");

  // A rank of padding rows only: no logits, a maximum of -inf and empty sums.
  Backend& b = tested();
  const shardlm::VocabShardRows padding{30, 0};
  const Buffer logits = upload(b, logits0), tg = upload_ints(b, targets);
  Buffer row_max(b, rows * 4), part(b, 2 * rows * 4);
  b.vocab_shard_row_max(row_max.f32(), logits.f32(), ld, rows, padding);
  const Buffer gmax = upload(b, Vec(rows, 1.0f));
  b.vocab_shard_softmax_sums(part.f32(), logits.f32(), ld, gmax.f32(), tg.i32(), rows, padding);
  for (float v : row_max.read(rows)) EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
  for (float v : part.read(2 * rows)) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(logits.read(size_t(rows) * ld), logits0);
}

TEST_P(BackendOps, Sums) {
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(300001)}) {
    const Vec data = random_vec(size_t(n), 121, 1.0, 0.25);
    Backend& b = tested();
    const Buffer d = upload(b, data);
    double sum = 0.0, squares = 0.0;
    for (float v : data) {
      sum += v;
      squares += double(v) * v;
    }
    // Double accumulation in any order: agreement to ~1e-15 relative for these sizes.
    EXPECT_NEAR(b.sum(d.f32(), n), sum, 1e-12 * std::max(1.0, std::fabs(sum))) << n;
    EXPECT_NEAR(b.sum_of_squares(d.f32(), n), squares, 1e-12 * squares) << n;
    EXPECT_NEAR(b.sum_of_squares(d.f32(), n), reference().sum_of_squares(
                                                  upload(reference(), data).f32(), n),
                1e-12 * squares);
    // Run to run: bit for bit.
    EXPECT_EQ(b.sum(d.f32(), n), b.sum(d.f32(), n));
  }
}

// --- quantized weights -----------------------------------------------------------------------------

TEST_P(BackendOps, Nf4Dequantize) {
  for (int64_t n : {int64_t(1), int64_t(64), int64_t(1001)}) {
    const Vec values = random_vec(size_t(n), 131);
    std::vector<uint32_t> storage(size_t(shardlm::cpu::nf4_storage_words(n)));
    shardlm::cpu::nf4_quantize(values.data(), n, storage.data());
    for (DType type : {DType::fp32, DType::bf16, DType::fp16}) {
      Backend& b = tested();
      Buffer in(b, storage.size() * sizeof(uint32_t));
      b.copy_from_host(in.data(), storage.data(), storage.size() * sizeof(uint32_t));
      Buffer out(b, size_t(n) * 4);
      b.nf4_dequantize(in.data(), n, out.typed(type));
      const Vec got = out.read(type, size_t(n));
      // Independent: decode the format (cpu/nf4.hpp) by hand.
      const auto* bytes = reinterpret_cast<const uint8_t*>(storage.data()) +
                          4 * shardlm::cpu::nf4_blocks(n);
      for (int64_t i = 0; i < n; ++i) {
        const int code = i % 2 == 0 ? bytes[i / 2] >> 4 : bytes[i / 2] & 15;
        float absmax;
        std::memcpy(&absmax, &storage[size_t(i / 64)], sizeof(float));
        const float want = shardlm::round_to(type, shardlm::cpu::kNf4Codes[code] * absmax);
        ASSERT_EQ(got[size_t(i)], want) << "nf4 " << shardlm::dtype_name(type) << " n " << n
                                        << " at " << i;
      }
    }
  }
}

// --- optimizer -------------------------------------------------------------------------------------

TEST_P(BackendOps, AdamW) {
  const int64_t n = 5000;
  std::vector<shardlm::ElementRange> few = {{0, 100}, {1000, 1003}, {4000, 5000}};
  // More ranges than one CUDA launch carries (32): the slice is cut into pieces.
  std::vector<shardlm::ElementRange> many;
  for (int64_t begin = 7; begin + 20 < n; begin += 61) many.push_back({begin, begin + 20});
  const Vec params0 = random_vec(size_t(n), 141), grads = random_vec(size_t(n), 142);
  const Vec m0 = random_vec(size_t(n), 143, 0.1), v_raw = random_vec(size_t(n), 144, 0.1);
  Vec v0(v_raw.size());
  for (size_t i = 0; i < v0.size(); ++i) v0[i] = v_raw[i] * v_raw[i];
  const shardlm::AdamWConfig config;
  const float lr = 1e-3f, grad_multiplier = 0.7f;
  const int64_t step = 3;
  for (const auto* ranges : {&few, &many})
    for (DType rounded_type : {DType::fp32, DType::bf16}) {
      auto run = [&](Backend& b) {
        Buffer p = upload(b, params0), g = upload(b, grads), m = upload(b, m0), v = upload(b, v0);
        Buffer rounded_params(b, size_t(n) * 4);
        b.adamw_update(p.f32(), g.f32(), m.f32(), v.f32(), n, *ranges, lr, grad_multiplier, step,
                       config, rounded_params.typed(rounded_type));
        return std::vector<Vec>{p.read(size_t(n)), m.read(size_t(n)), v.read(size_t(n)),
                                rounded_params.read(rounded_type, size_t(n))};
      };
      const std::string what = std::string("adamw ") + (ranges == &few ? "few" : "many") +
                               " ranges, rounded " +
                               std::string(shardlm::dtype_name(rounded_type));
      compare_with_cpu(tested(), run, {kFp32Tol, kFp32Tol, kFp32Tol, tolerance(rounded_type)},
                       what);
      // Independent: torch.optim.AdamW's formula in double.
      const std::vector<Vec> got = run(tested());
      Vec want(static_cast<size_t>(n));
      const double b1 = config.beta1, b2 = config.beta2;
      for (int64_t i = 0; i < n; ++i) {
        bool decayed = false;
        for (const auto& r : *ranges) decayed |= r.begin <= i && i < r.end;
        const double g = double(grads[size_t(i)]) * grad_multiplier;
        double p = params0[size_t(i)];
        if (decayed) p *= 1.0 - double(lr) * config.weight_decay;
        const double m = b1 * m0[size_t(i)] + (1 - b1) * g;
        const double v = b2 * v0[size_t(i)] + (1 - b2) * g * g;
        const double m_hat = m / (1 - std::pow(b1, double(step)));
        const double v_hat = v / (1 - std::pow(b2, double(step)));
        want[size_t(i)] = static_cast<float>(p - lr * m_hat / (std::sqrt(v_hat) + config.eps));
      }
      // The update is lr-sized next to params of size 1: compare the updates themselves.
      Vec got_update(static_cast<size_t>(n)), want_update(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        got_update[size_t(i)] = got[0][size_t(i)] - params0[size_t(i)];
        want_update[size_t(i)] = want[size_t(i)] - params0[size_t(i)];
      }
      // fp32 rounding of params near 1 is 6e-8, i.e. ~1e-4 of an update of lr = 1e-3.
      expect_close(got_update, want_update, 1e-3, what + " update vs double reference");
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendOps, ::testing::Values(kCpu, kEmulated, kCuda),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
