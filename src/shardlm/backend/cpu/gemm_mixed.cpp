#include "shardlm/backend/cpu/gemm_mixed.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/gemm_recorder.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One cached primitive per call shape: creating a matmul primitive descriptor costs
// ~0.5-10 ms, a step uses a few dozen distinct shapes, each many times.
using ShapeKey = std::tuple<bool, bool, int, int, int, int, int, int, float, float, bool>;

struct Bf16Matmul {
  std::optional<dnnl::matmul> primitive;  // nullopt: oneDNN has no implementation
  std::string impl = "none";              // oneDNN's name of the implementation
  memory::desc a, b, c;
};

// Row-major op(X)[rows, cols] stored with row stride ld, as oneDNN strides.
memory::dims matrix_strides(int ld, bool transposed) {
  return transposed ? memory::dims{1, ld} : memory::dims{ld, 1};
}

memory::desc matrix_desc(int rows, int cols, int ld, bool transposed, memory::data_type type) {
  return memory::desc({rows, cols}, type, matrix_strides(ld, transposed));
}

// The same matrix as a batch of one. With first_operand, the batch gets a stride
// other than the dense one: oneDNN 2.6 runs dense bf16 matmuls on its brgemm kernels
// and any other layout on its JIT GEMM (gemm_bf16bf16f32), which took 2-5% less time
// over a training step's GEMMs here, up to 11% less on some shapes (docs/gemm.md,
// "bf16: brgemm or JIT GEMM"); the LM head's padded rows took it already. With one
// batch the batch stride never addresses memory, so it only chooses the kernel, the
// same one on every call, and results stay the same bits from run to run. (Three
// dimensions, not two, also keep these primitives apart from the dense ones in
// oneDNN's primitive cache, which treats a batch of one's stride as irrelevant.)
memory::desc jit_gemm_desc(int rows, int cols, int ld, bool transposed, memory::data_type type,
                           bool first_operand) {
  const memory::dim stored = static_cast<memory::dim>(transposed ? cols : rows) * ld;
  memory::dims strides = matrix_strides(ld, transposed);
  strides.insert(strides.begin(), first_operand ? 2 * stored : stored);
  return memory::desc({1, rows, cols}, type, strides);
}

Bf16Matmul make_matmul(const ShapeKey& key) {
  const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, dense] = key;
  Bf16Matmul m;
  const auto desc = [dense = dense](int rows, int cols, int ld, bool transposed,
                                    memory::data_type type, bool first_operand) {
    return dense ? matrix_desc(rows, cols, ld, transposed, type)
                 : jit_gemm_desc(rows, cols, ld, transposed, type, first_operand);
  };
  m.a = desc(M, K, lda, ta, memory::data_type::bf16, true);
  m.b = desc(K, N, ldb, tb, memory::data_type::bf16, false);
  m.c = desc(M, N, ldc, false, memory::data_type::f32, false);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m.a, m.b, m.c), attr, cpu_engine());
    m.primitive.emplace(pd);
    m.impl = pd.impl_info_str();
  } catch (const dnnl::error&) {
    // No bf16 matmul for this CPU (e.g. AVX2 only): the caller widens to fp32.
  }
  return m;
}

const Bf16Matmul& cached_matmul(const ShapeKey& key) {
  static std::mutex mutex;
  static std::map<ShapeKey, std::unique_ptr<Bf16Matmul>> cache;
  std::lock_guard lock(mutex);
  auto& slot = cache[key];
  if (!slot) slot = std::make_unique<Bf16Matmul>(make_matmul(key));
  return *slot;
}

// Widening scratch: grows to the largest pair of operands once, then is reused.
// One per thread, so concurrent callers do not share it.
float* widening_scratch(size_t floats) {
  thread_local TrackedBuffer buffer;
  return static_cast<float*>(buffer.grow_to(MemCategory::other, floats * sizeof(float)));
}

void gemm_widened(bool ta, bool tb, int M, int N, int K, float alpha, ConstTypedPtr A, int lda,
                  ConstTypedPtr B, int ldb, float beta, float* C, int ldc) {
  const int a_rows = ta ? K : M, a_cols = ta ? M : K;
  const int b_rows = tb ? N : K, b_cols = tb ? K : N;
  const size_t a_floats = A.dtype == DType::fp32 ? 0 : static_cast<size_t>(a_rows) * a_cols;
  const size_t b_floats = B.dtype == DType::fp32 ? 0 : static_cast<size_t>(b_rows) * b_cols;
  float* scratch = widening_scratch(a_floats + b_floats);
  const float* a = nullptr;
  const float* b = nullptr;
  if (a_floats > 0) {
    convert_rows(scratch, a_cols, A, lda, a_rows, a_cols);
    a = scratch;
    lda = a_cols;
  } else {
    a = A.f32();
  }
  if (b_floats > 0) {
    convert_rows(scratch + a_floats, b_cols, B, ldb, b_rows, b_cols);
    b = scratch + a_floats;
    ldb = b_cols;
  } else {
    b = B.f32();
  }
  sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
}

// SHARDLM_BF16_MATMUL=dense lets oneDNN pick the kernel for dense operands (its
// brgemm) in kAuto runs, to compare the two on whole training steps.
bool dense_from_environment() {
  static const bool dense = [] {
    const char* value = std::getenv("SHARDLM_BF16_MATMUL");
    const std::string_view name = value == nullptr ? "" : value;
    if (name.empty() || name == "jit") return false;
    if (name == "dense") return true;
    throw Error(fmt::format("SHARDLM_BF16_MATMUL={} is not a bf16 matmul kernel choice; "
                            "expected jit or dense", name));
  }();
  return dense;
}

bool run_onednn_bf16(bool dense, bool ta, bool tb, int M, int N, int K, float alpha,
                     ConstTypedPtr A, int lda, ConstTypedPtr B, int ldb, float beta, float* C,
                     int ldc) {
  // The fp32 and widened paths are charged to gemm inside sgemm (the widening
  // conversion to norms_elementwise), so each library call is counted once.
  const PhaseScope phase(Phase::gemm);
  const Bf16Matmul& m = cached_matmul({ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, dense});
  if (!m.primitive) return false;
  thread_local dnnl::stream stream(cpu_engine());
  dnnl::engine& engine = cpu_engine();
  // oneDNN's memory objects take non-const handles; sources are only read.
  memory a(m.a, engine, const_cast<void*>(A.data));
  memory b(m.b, engine, const_cast<void*>(B.data));
  memory c(m.c, engine, C);
  m.primitive->execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  stream.wait();
  return true;
}

struct Bf16Support {
  bool available = false;
  std::string impl = "none";
};

const Bf16Support& bf16_support() {
  static const Bf16Support support = [] {
    Bf16Support s;
    const Bf16Matmul& m = cached_matmul(
        {false, false, 64, 64, 64, 64, 64, 64, 1.0f, 0.0f, dense_from_environment()});
    s.available = m.primitive.has_value();
    s.impl = m.impl;
    return s;
  }();
  return support;
}

}  // namespace

bool onednn_has_bf16_matmul() { return bf16_support().available; }
const char* onednn_bf16_matmul_impl() { return bf16_support().impl.c_str(); }

void gemm_on(Bf16GemmPath path, bool ta, bool tb, int M, int N, int K, float alpha,
             ConstTypedPtr A, int lda, ConstTypedPtr B, int ldb, float beta, float* C, int ldc) {
  check_gemm_arguments("gemm", ta, tb, M, N, K, lda, ldb, ldc);
  if (A.dtype == DType::fp32 && B.dtype == DType::fp32) {
    sgemm(ta, tb, M, N, K, alpha, A.f32(), lda, B.f32(), ldb, beta, C, ldc);
    return;
  }
  if (M == 0 || N == 0 || K == 0) {  // sgemm handles the degenerate cases
    sgemm(ta, tb, M, N, K, alpha, nullptr, lda, nullptr, ldb,
          beta, C, ldc);
    return;
  }
  if (A.dtype == DType::bf16 && B.dtype == DType::bf16 && path != Bf16GemmPath::kWidenToFp32) {
    const bool dense = path == Bf16GemmPath::kOneDnnMatmulDense ||
                       (path == Bf16GemmPath::kAuto && dense_from_environment());
    if (run_onednn_bf16(dense, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    SHARDLM_CHECK(path == Bf16GemmPath::kAuto,
                  "gemm: oneDNN has no bf16 matmul for M={} N={} K={} on this CPU", M, N, K);
  }
  gemm_widened(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, ConstTypedPtr A, int lda,
          ConstTypedPtr B, int ldb, float beta, float* C, int ldc) {
  GemmRecorder::note({ta, tb, M, N, K, lda, ldb, ldc, beta, A.dtype, B.dtype});
  gemm_on(Bf16GemmPath::kAuto, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace shardlm::cpu
