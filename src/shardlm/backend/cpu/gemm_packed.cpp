#include "shardlm/backend/cpu/gemm_packed.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Row-major op(X)[rows, cols] stored with row stride ld, as oneDNN strides.
memory::desc matrix_desc(int rows, int cols, int ld, bool transposed, memory::data_type type) {
  const memory::dims strides = transposed ? memory::dims{1, ld} : memory::dims{ld, 1};
  return memory::desc({rows, cols}, type, strides);
}

// The matmul primitive descriptor that chooses the packed layout: op(A) contiguous with
// max_rows rows, weights in whatever layout it prefers.
std::optional<dnnl::matmul::primitive_desc> layout_chooser(int N, int K, int max_rows) {
  const memory::desc a = matrix_desc(max_rows, K, K, false, memory::data_type::bf16);
  const memory::desc b({K, N}, memory::data_type::bf16, memory::format_tag::any);
  const memory::desc c = matrix_desc(max_rows, N, N, false, memory::data_type::f32);
  try {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine());
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// Packs a plain row-major B [K, N] (row stride ldb) into oneDNN's BA16a64b2a layout
// (the one its bf16 brgemm matmul picks for these weights): blocks of 32 rows x 64
// columns, N blocks outermost (stride n_stride elements) then K blocks (k_stride),
// inside a block 16 row pairs x 64 columns x the pair (row 2p, row 2p+1); padding zero.
// oneDNN's reorder took 48 ms for the GPT-2 head's [50257, 768] weight on this
// machine, more than the packed layout saves in a step; this takes ~8 ms. (A
// transposed B is a dword transpose, which oneDNN's reorder already does at ~12 ms.)
void pack_ba16a64b2a(uint16_t* dst, int64_t k_stride, int64_t n_stride, const uint16_t* B, int ldb,
                     int K, int N) {
  constexpr int kRows = 32, kCols = 64;
  const int k_blocks = (K + kRows - 1) / kRows;
  const int n_blocks = (N + kCols - 1) / kCols;
#pragma omp parallel for collapse(2) schedule(static)
  for (int nb = 0; nb < n_blocks; ++nb) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      auto* block = reinterpret_cast<uint32_t*>(dst + nb * n_stride + kb * k_stride);
      const int n0 = nb * kCols;
      const int width = std::min(kCols, N - n0);
      for (int p = 0; p < kRows / 2; ++p) {
        const int k = kb * kRows + 2 * p;
        uint32_t* out = block + p * kCols;
        if (k + 1 < K && width == kCols) {
          const uint16_t* first = B + static_cast<int64_t>(k) * ldb + n0;
          const uint16_t* second = first + ldb;
#pragma omp simd
          for (int c = 0; c < kCols; ++c)
            out[c] = static_cast<uint32_t>(first[c]) | (static_cast<uint32_t>(second[c]) << 16);
          continue;
        }
        for (int c = 0; c < kCols; ++c) {
          const bool column = c < width;
          const uint32_t lo = column && k < K ? B[static_cast<int64_t>(k) * ldb + n0 + c] : 0;
          const uint32_t hi = column && k + 1 < K ? B[static_cast<int64_t>(k + 1) * ldb + n0 + c] : 0;
          out[c] = lo | (hi << 16);
        }
      }
    }
  }
}

}  // namespace

struct PackedGemmOperand::Impl {
  MemCategory category;
  MemoryTracker* tracker;
  // The shape packed for, and the plain operand (the fallback of gemm_packed).
  bool trans_b = false;
  int N = 0, K = 0, ldb = 0, max_rows = 0;
  ConstTypedPtr plain;
  bool packed = false;
  bool have_shape = false;
  memory::desc packed_desc;
  TrackedBuffer buffer;
  // A plain B in the layout pack_ba16a64b2a writes: packed by it, else by oneDNN's reorder.
  bool own_packing = false;
  int64_t k_stride = 0, n_stride = 0;
  std::optional<dnnl::reorder> reorder;
  // Matmuls on the packed layout per (trans_a, M, lda, ldc, alpha, beta); nullopt where
  // oneDNN has none (or only its reference implementation) for that call.
  using CallKey = std::tuple<bool, int, int, int, float, float>;
  std::map<CallKey, std::optional<dnnl::matmul>> matmuls;

  const std::optional<dnnl::matmul>& matmul_for(const CallKey& key) {
    auto it = matmuls.find(key);
    if (it != matmuls.end()) return it->second;
    const auto [ta, M, lda, ldc, alpha, beta] = key;
    std::optional<dnnl::matmul> m;
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    try {
      const dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(matrix_desc(M, K, lda, ta, memory::data_type::bf16), packed_desc,
                             matrix_desc(M, N, ldc, false, memory::data_type::f32)),
          attr, engine());
      if (!std::string_view(pd.impl_info_str()).starts_with("ref")) m.emplace(pd);
    } catch (const dnnl::error&) {
      // No implementation for the packed layout at this shape: the plain path runs.
    }
    return matmuls.emplace(key, std::move(m)).first->second;
  }
};

PackedGemmOperand::PackedGemmOperand(MemCategory category, MemoryTracker& tracker)
    : impl_(std::make_unique<Impl>()) {
  impl_->category = category;
  impl_->tracker = &tracker;
}

PackedGemmOperand::~PackedGemmOperand() = default;

bool PackedGemmOperand::packed() const { return impl_->packed; }
bool PackedGemmOperand::packed_by_shardlm() const { return impl_->packed && impl_->own_packing; }

int64_t PackedGemmOperand::packed_bytes(int N, int K, int max_rows) {
  if (!onednn_has_bf16_matmul()) return 0;
  const auto pd = layout_chooser(N, K, max_rows);
  return pd ? static_cast<int64_t>(pd->weights_desc().get_size()) : 0;
}

bool PackedGemmOperand::pack(bool trans_b, int N, int K, ConstTypedPtr B, int ldb, int max_rows) {
  Impl& m = *impl_;
  check_gemm_arguments("gemm_packed", false, trans_b, max_rows, N, K, K, ldb, N);
  m.plain = B;
  m.packed = false;
  if (B.dtype != DType::bf16 || !onednn_has_bf16_matmul() || N == 0 || K == 0) return false;
  const bool same_shape = m.have_shape && m.trans_b == trans_b && m.N == N && m.K == K &&
                          m.ldb == ldb && m.max_rows == max_rows;
  if (!same_shape) {
    const auto pd = layout_chooser(N, K, max_rows);
    if (!pd) return false;
    m.trans_b = trans_b;
    m.N = N;
    m.K = K;
    m.ldb = ldb;
    m.max_rows = max_rows;
    m.packed_desc = pd->weights_desc();
    m.matmuls.clear();
    const size_t bytes = m.packed_desc.get_size();
    if (m.buffer.bytes() != bytes) {
      m.buffer.release();  // first, so the peak never holds both
      m.buffer = TrackedBuffer(m.category, bytes, *m.tracker);
    }
    const memory::desc ours({K, N}, memory::data_type::bf16, memory::format_tag::BA16a64b2a);
    m.own_packing = !trans_b && ours == m.packed_desc;
    if (m.own_packing) {
      const auto& blocking = m.packed_desc.data.format_desc.blocking;
      m.k_stride = blocking.strides[0];
      m.n_stride = blocking.strides[1];
      m.reorder.reset();
    } else {
      const memory::desc plain = matrix_desc(K, N, ldb, trans_b, memory::data_type::bf16);
      m.reorder.emplace(dnnl::reorder::primitive_desc(engine(), plain, engine(), m.packed_desc));
    }
    m.have_shape = true;
  }
  const PhaseScope phase(Phase::gemm);
  if (m.own_packing) {
    pack_ba16a64b2a(m.buffer.as<uint16_t>(), m.k_stride, m.n_stride,
                    static_cast<const uint16_t*>(B.data), ldb, K, N);
    m.packed = true;
    return true;
  }
  thread_local dnnl::stream stream(engine());
  // oneDNN's memory objects take non-const handles; the source is only read.
  memory src(matrix_desc(K, N, ldb, trans_b, memory::data_type::bf16), engine(),
             const_cast<void*>(B.data));
  memory dst(m.packed_desc, engine(), m.buffer.data());
  m.reorder->execute(stream, src, dst);
  stream.wait();
  m.packed = true;
  return true;
}

void gemm_packed(bool trans_a, int M, float alpha, ConstTypedPtr A, int lda,
                 const PackedGemmOperand& B, float beta, float* C, int ldc) {
  PackedGemmOperand::Impl& m = *B.impl_;
  const std::optional<dnnl::matmul>* matmul = nullptr;
  if (m.packed && A.dtype == DType::bf16 && M > 0 && M <= m.max_rows)
    matmul = &m.matmul_for({trans_a, M, lda, ldc, alpha, beta});
  if (matmul == nullptr || !matmul->has_value()) {
    gemm(trans_a, m.trans_b, M, m.N, m.K, alpha, A, lda, m.plain, m.ldb, beta, C, ldc);
    return;
  }
  check_gemm_arguments("gemm_packed", trans_a, false, M, m.N, m.K, lda, m.N, ldc);
  const PhaseScope phase(Phase::gemm);
  thread_local dnnl::stream stream(engine());
  memory a(matrix_desc(M, m.K, lda, trans_a, memory::data_type::bf16), engine(),
           const_cast<void*>(A.data));
  memory b(m.packed_desc, engine(), m.buffer.data());
  memory c(matrix_desc(M, m.N, ldc, false, memory::data_type::f32), engine(), C);
  (*matmul)->execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  stream.wait();
}

}  // namespace shardlm::cpu
