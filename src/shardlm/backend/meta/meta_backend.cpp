#include "shardlm/backend/meta/meta_backend.hpp"

#include <atomic>

#include <fmt/format.h>

namespace shardlm::meta {

namespace {

// One address space for every meta allocator of the process, handed out upwards and
// never reused, so no two buffers alive at once (or ever) overlap. Bit 60 keeps the
// addresses non-canonical (see the header); 2^60 bytes outlast any number of plans.
std::atomic<uintptr_t> next_address{kMetaAddressBit};

double bytes_of(DType type, int64_t n) {
  return static_cast<double>(dtype_bytes(type)) * static_cast<double>(n);
}
double f32(int64_t n) { return 4.0 * static_cast<double>(n); }

}  // namespace

class MetaBackend::Allocator final : public DeviceAllocator {
 public:
  Allocator(Device planned, MemoryTracker& tracker) : planned_(planned), tracker_(tracker) {}
  Device device() const override { return planned_; }
  MemoryTracker& tracker() override { return tracker_; }
  void* allocate(size_t bytes, std::string_view) override {
    const uintptr_t aligned = (bytes + 63) / 64 * 64;
    return reinterpret_cast<void*>(next_address.fetch_add(aligned == 0 ? 64 : aligned));
  }
  void deallocate(void*, size_t) override {}

 private:
  const Device planned_;
  MemoryTracker& tracker_;
};

MetaBackend::MetaBackend(Device planned)
    : planned_(planned), allocator_(std::make_unique<Allocator>(planned, tracker_)) {}

MetaBackend::~MetaBackend() = default;

ComputeWork MetaBackend::take_work() {
  ComputeWork out = work_;
  work_ = ComputeWork{};
  return out;
}

std::string MetaBackend::description() const {
  return fmt::format("meta ({} planned: sizes, no storage)", to_string(planned_));
}

DeviceAllocator& MetaBackend::allocator() { return *allocator_; }

void MetaBackend::elementwise(double bytes) {
  work_.elementwise_bytes += bytes;
}

void MetaBackend::state(double bytes) {
  work_.state_bytes += bytes;
}

// ---- memory movement: bytes read plus bytes written ----
void MetaBackend::copy(void*, const void*, size_t bytes) { state(2.0 * static_cast<double>(bytes)); }
void MetaBackend::copy_to_host(void*, const void*, size_t bytes) { state(2.0 * static_cast<double>(bytes)); }
void MetaBackend::copy_from_host(void*, const void*, size_t bytes) { state(2.0 * static_cast<double>(bytes)); }
void MetaBackend::fill_zero(void*, size_t bytes) { state(static_cast<double>(bytes)); }

// ---- GEMM and conversions ----
void MetaBackend::gemm(bool, bool, int M, int N, int K, float, ConstTypedPtr, int, ConstTypedPtr,
                       int, float, float*, int) {
  work_.gemm_flops += 2.0 * M * static_cast<double>(N) * K;
}
void MetaBackend::convert(TypedPtr dst, ConstTypedPtr src, int64_t n) {
  state(bytes_of(src.dtype, n) + bytes_of(dst.dtype, n));
}
void MetaBackend::convert_rows(TypedPtr dst, int64_t, ConstTypedPtr src, int64_t, int64_t rows,
                               int64_t cols) {
  state(bytes_of(src.dtype, rows * cols) + bytes_of(dst.dtype, rows * cols));
}
void MetaBackend::round_to(DType, float*, const float*, int64_t n) { state(2 * f32(n)); }
void MetaBackend::accumulate(float*, const float*, int64_t n) { state(3 * f32(n)); }

// ---- elementwise: the activations read and written ----
void MetaBackend::add_bias(float*, const float*, int64_t N, int M) { elementwise(2 * f32(N * M)); }
void MetaBackend::add_bias(TypedPtr out, const float*, const float*, int64_t N, int M) {
  elementwise(f32(N * M) + bytes_of(out.dtype, N * M));
}
void MetaBackend::residual_add_bias(float*, const float*, const float*, const float*, int64_t N,
                                    int M) {
  elementwise(3 * f32(N * M));
}
void MetaBackend::bias_backward(float*, const float*, int64_t N, int M) { elementwise(f32(N * M)); }
void MetaBackend::bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float*, const float*,
                                    int64_t N, int M) {
  elementwise(f32(N * M) + bytes_of(out.dtype, N * M) + bytes_of(pre_out.dtype, N * M));
}
void MetaBackend::gelu_backward(float*, const float*, ConstTypedPtr pre, int64_t count) {
  elementwise(2 * f32(count) + bytes_of(pre.dtype, count));
}
void MetaBackend::swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float*, int64_t N, int I) {
  elementwise(f32(2 * N * I) + bytes_of(h.dtype, N * I) +
              (gate_up_out.data != nullptr ? bytes_of(gate_up_out.dtype, 2 * N * I) : 0.0));
}
void MetaBackend::swiglu_backward(float*, const float*, ConstTypedPtr gate_up, int64_t N, int I) {
  elementwise(f32(2 * N * I) + f32(N * I) + bytes_of(gate_up.dtype, 2 * N * I));
}

// ---- norms ----
void MetaBackend::layernorm_forward(TypedPtr out, float*, float*, const float*, const float*,
                                    const float*, int64_t N, int C) {
  elementwise(f32(N * C) + bytes_of(out.dtype, N * C));
}
void MetaBackend::residual_layernorm_forward(float*, TypedPtr out, float*, float*, const float*,
                                             const float*, const float*, const float*,
                                             const float*, int64_t N, int C) {
  elementwise(3 * f32(N * C) + bytes_of(out.dtype, N * C));
}
void MetaBackend::layernorm_backward(float*, float*, float*, const float*, const float*,
                                     const float*, const float*, const float*, int64_t N, int C) {
  elementwise(3 * f32(N * C));
}
void MetaBackend::rmsnorm_forward(TypedPtr y, int64_t, float*, ConstTypedPtr x, int64_t,
                                  const float*, const RmsNormShape& s, float) {
  const int64_t n = s.rows * s.heads * s.dim;
  elementwise(bytes_of(x.dtype, n) + bytes_of(y.dtype, n));
}
void MetaBackend::residual_rmsnorm_forward(float*, TypedPtr y, float*, const float*, const float*,
                                           const float*, const float*, int64_t N, int C, float) {
  elementwise(3 * f32(N * C) + bytes_of(y.dtype, N * C));
}
void MetaBackend::rmsnorm_backward(float*, int64_t, float*, const float*, int64_t,
                                   ConstTypedPtr x, int64_t, const float*, const float*,
                                   const RmsNormShape& s, bool) {
  const int64_t n = s.rows * s.heads * s.dim;
  elementwise(2 * f32(n) + bytes_of(x.dtype, n));
}

// ---- positions, attention, embeddings ----
void MetaBackend::rope_forward(TypedPtr y, int64_t, const float*, int64_t, int64_t rows,
                               int heads, int head_dim, const int32_t*, const RopeTableView&) {
  const int64_t n = rows * heads * head_dim;
  elementwise(f32(n) + bytes_of(y.dtype, n));
}
void MetaBackend::rope_backward(float*, int64_t, const float*, int64_t, int64_t rows, int heads,
                                int head_dim, const int32_t*, const RopeTableView&) {
  elementwise(2 * f32(rows * heads * head_dim));
}
namespace {
// Causal attention's two matmuls (Q K^T and P V) over the T (T + 1) / 2 visible pairs.
double causal_attention_flops(const AttentionShape& s) {
  const double pairs = static_cast<double>(s.T) * (s.T + 1) / 2.0;
  return 2.0 * 2.0 * s.B * s.n_head * pairs * s.head_dim;
}
}  // namespace
void MetaBackend::attention_forward(TypedPtr, float*, ConstTypedPtr, const AttentionShape& s,
                                    const int32_t*) {
  work_.attention_flops += causal_attention_flops(s);
}
void MetaBackend::attention_backward(float*, const float*, ConstTypedPtr, ConstTypedPtr,
                                     const float*, const AttentionShape& s, const int32_t*) {
  work_.attention_flops += 2.0 * causal_attention_flops(s);  // dQ, dK, dV, dP
}
namespace {
// A ring block's two matmuls over half its query x key pairs: the key ranges are not
// readable here (no storage), and under the zigzag split a rank's blocks see half their
// pairs each (the causal share of the whole rows, T^2 / 2P, over the P blocks).
double ring_block_flops(const AttentionBlockShape& s) {
  const double pairs = static_cast<double>(s.q_len) * s.kv_len / 2.0;
  return 2.0 * 2.0 * s.B * s.n_head * pairs * s.head_dim;
}
}  // namespace
void MetaBackend::attention_block_forward(float*, float*, ConstTypedPtr, int64_t, ConstTypedPtr,
                                          const AttentionBlockShape& s, const int32_t*) {
  work_.attention_flops += ring_block_flops(s);
}
void MetaBackend::attention_block_backward(float*, float*, const float*, ConstTypedPtr,
                                           const float*, ConstTypedPtr, int64_t, ConstTypedPtr,
                                           const AttentionBlockShape& s, const int32_t*) {
  work_.attention_flops += 2.0 * ring_block_flops(s);
}
void MetaBackend::attention_lse_merge(float*, float*, const float*, const float*,
                                      const AttentionBlockShape& s) {
  const int64_t n = static_cast<int64_t>(s.B) * s.q_len * s.q_columns();
  elementwise(3 * f32(n));
}
void MetaBackend::embedding_forward(float*, const int32_t*, ConstTypedPtr wte, ConstTypedPtr, int B,
                                    int T, int C, DType, const int32_t*) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  elementwise(f32(n) + bytes_of(wte.dtype, n));
}
void MetaBackend::embedding_backward(float*, float*, const float*, const int32_t*, int B, int T,
                                     int C, const int32_t*) {
  elementwise(3 * f32(static_cast<int64_t>(B) * T * C));
}

// ---- loss: the head's GEMMs (logits, and dX / dW when asked) and the softmax ----
void MetaBackend::lm_head_cross_entropy(const LmHeadLossArgs& a, float*, float* dx,
                                        float* dweight) {
  const double gemm = 2.0 * static_cast<double>(a.N) * a.V * a.C;
  work_.gemm_flops += gemm * (1 + (dx != nullptr ? 1 : 0) + (dweight != nullptr ? 1 : 0));
  work_.loss_bytes += 8.0 * static_cast<double>(a.N) * static_cast<double>(a.logits_stride);
}
double MetaBackend::sum(const float*, int64_t n) {
  state(f32(n));
  return 0.0;
}

// ---- the vocabulary-parallel lookup's masking and the loss's softmax over a shard ----
void MetaBackend::vocab_shard_localize(int32_t*, const int32_t*, int64_t n, VocabShardRows) {
  elementwise(2 * f32(n));
}
void MetaBackend::vocab_shard_mask_rows(float*, const int32_t*, int64_t n, int C, VocabShardRows) {
  elementwise(f32(n) + f32(n * C));  // the tokens read, at most every row written
}
void MetaBackend::vocab_shard_row_max(float*, const float*, int64_t, int rows, VocabShardRows shard) {
  work_.loss_bytes += f32(static_cast<int64_t>(rows) * shard.real);
}
void MetaBackend::vocab_shard_softmax_sums(float*, float*, int64_t, const float*, const int32_t*,
                                           int rows, VocabShardRows shard) {
  work_.loss_bytes += 2 * f32(static_cast<int64_t>(rows) * shard.real);
}
void MetaBackend::vocab_shard_loss(float*, const float*, const float*, const int32_t*, int rows) {
  work_.loss_bytes += 5 * f32(rows);
}
void MetaBackend::vocab_shard_softmax_backward(float*, int64_t, const float*, const int32_t*,
                                               int rows, float, VocabShardRows shard) {
  work_.loss_bytes += 2 * f32(static_cast<int64_t>(rows) * shard.real);
}

void MetaBackend::nf4_dequantize(const void*, int64_t n, TypedPtr out) {
  elementwise(static_cast<double>(n) / 2 + bytes_of(out.dtype, n));
}

// ---- mixture of experts: rows moved (read and written), indices and weights read ----
void MetaBackend::gather_rows(TypedPtr, ConstTypedPtr src, const int32_t*, int64_t rows,
                              int64_t width) {
  state(2 * bytes_of(src.dtype, rows * width) + f32(rows));
}
void MetaBackend::scatter_add_rows(float*, const float*, const int32_t*, const float* weight,
                                   int64_t rows, int64_t width) {
  elementwise(3 * f32(rows * width) + f32(rows) * (weight != nullptr ? 2 : 1));
}
void MetaBackend::moe_assignment_weights(float*, const float*, const int32_t*, const int32_t*, int,
                                         int64_t rows) {
  state(4 * f32(rows));
}
void MetaBackend::moe_scatter_weight_grads(float*, const float*, const int32_t*, const int32_t*,
                                           int, int64_t rows) {
  state(5 * f32(rows));
}
void MetaBackend::moe_weight_backward(float*, float*, const float*, int64_t I, float*, int64_t C,
                                      const float*, int64_t rows) {
  elementwise(f32(rows * (3 * I + 2 * C)) + 2 * f32(rows));
}
void MetaBackend::moe_router_backward(float*, const float*, const int32_t*, const float*,
                                      const float*, int64_t n, int E, int k, bool) {
  elementwise(2 * f32(n * E) + 2 * f32(n * k));
}
void MetaBackend::shared_expert_gate_forward(float*, float* y, const float*, int64_t n, int64_t C) {
  elementwise(2 * f32(n) + (y != nullptr ? 3 * f32(n * C) : 0.0));
}
void MetaBackend::shared_expert_gate_backward(float*, float*, const float*, const float*,
                                              const float*, int64_t n, int64_t C) {
  elementwise(3 * f32(n * C) + 2 * f32(n));
}

// ---- optimizer: AdamW reads master, gradient, m, v (16 bytes) and writes master,
// m, v (12), plus the rounded copy where it writes one ----
void MetaBackend::adamw_update(float*, const float*, float*, float*, int64_t n,
                               std::span<const ElementRange>, float, float, int64_t,
                               const AdamWConfig&, TypedPtr rounded_params) {
  work_.optimizer_bytes +=
      28.0 * static_cast<double>(n) +
      (rounded_params.data != nullptr ? bytes_of(rounded_params.dtype, n) : 0.0);
}
double MetaBackend::sum_of_squares(const float*, int64_t n) {
  state(f32(n));
  return 0.0;
}

}  // namespace shardlm::meta
