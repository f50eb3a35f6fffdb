// The CUDA backend: the Backend table on one GPU. GEMMs run on cuBLASLt, everything else
// on shardlm's own kernels (kernels.cuh), attention and the cross-entropy rows on the
// attention room's (attention.cuh, cross_entropy.cuh). Every call enqueues on the
// backend's one non-blocking stream, so kernels run in the order they were issued and
// never wait on the legacy default stream; the host waits only where it reads a result
// (copy_to_host, sum, sum_of_squares) or where a host buffer must be free on return
// (copy_from_host), and every wait has a deadline.
#include "shardlm/backend/cuda/cuda_backend.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/adamw_config.hpp"
#include "shardlm/backend/cuda/attention.cuh"
#include "shardlm/backend/cuda/attention_block.cuh"
#include "shardlm/backend/cuda/cross_entropy.cuh"
#include "shardlm/backend/cuda/cuda_check.hpp"
#include "shardlm/backend/kernel_checks.hpp"
#include "shardlm/backend/cuda/kernels.cuh"
#include "shardlm/core/error.hpp"

namespace shardlm::cuda {

namespace {

// A stream wait longer than this is a hung kernel or a lost device: an error naming the
// wait, not a silent hang. 600 s by default (generous: one step of a large model is
// seconds); SHARDLM_CUDA_STREAM_TIMEOUT=SECONDS sets it (scripts/gpu_check.sh: 60, so a
// hang ends well inside one command on a borrowed GPU).
double stream_wait_timeout_seconds() {
  static const double seconds = [] {
    const char* text = std::getenv("SHARDLM_CUDA_STREAM_TIMEOUT");
    if (text == nullptr || *text == '\0') return 600.0;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    SHARDLM_CHECK(end != text && *end == '\0' && std::isfinite(value) && value > 0,
                  "SHARDLM_CUDA_STREAM_TIMEOUT='{}': expected a number of seconds > 0", text);
    return value;
  }();
  return seconds;
}

// Waits for every kernel issued so far on `stream`. Polls (cudaStreamQuery) instead of
// blocking in cudaStreamSynchronize, so the wait can time out.
void wait_for_stream(cudaStream_t stream, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady)  // a kernel failed (the error is the kernel's)
      throw Error(fmt::format("CUDA error while waiting in {} (cudaStreamQuery): {} ({})", what,
                              cudaGetErrorString(status), cudaGetErrorName(status)));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    SHARDLM_CHECK(waited < stream_wait_timeout_seconds(),
                  "cuda: {} waited {:.0f} s for the GPU's stream to finish (a hung kernel or a "
                  "lost device?)",
                  what, waited);
    // Spin briefly (most waits are short), then stop burning a core.
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// Waits for an event (one never recorded counts as done), with the same deadline.
void wait_for_event(cudaEvent_t event, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady)
      throw Error(fmt::format("CUDA error while waiting in {} (cudaEventQuery): {} ({})", what,
                              cudaGetErrorString(status), cudaGetErrorName(status)));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    SHARDLM_CHECK(waited < stream_wait_timeout_seconds(),
                  "cuda: {} waited {:.0f} s for the GPU (a hung kernel or a lost device?)", what,
                  waited);
    std::this_thread::yield();
  }
}

// The largest power of two (up to 256) dividing the address: cuBLASLt picks kernels by
// the operands' alignment, which a row offset into a buffer can lower.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::fp16:
      return CUDA_R_16F;
    case DType::fp32:
      break;
  }
  return CUDA_R_32F;
}

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// Device memory of one GPU: cudaMalloc, zero-filled before it is returned (the
// DeviceAllocator contract). The fill runs on the backend's stream and is waited for,
// so the zeros are there for any stream (a communicator's too). cudaFree orders itself
// after all work on the device, so a buffer never disappears under a running kernel.
class CudaAllocator final : public DeviceAllocator {
 public:
  CudaAllocator(int index, cudaStream_t stream) : index_(index), stream_(stream) {}

  Device device() const override { return {DeviceKind::cuda, index_}; }

  void* allocate(size_t bytes, std::string_view what) override {
    SHARDLM_CUDA_CHECK(cudaSetDevice(index_));
    void* data = nullptr;
    const cudaError_t status = cudaMalloc(&data, bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      throw Error(fmt::format(
          "cuda:{}: cannot allocate {} bytes ({:.1f} MiB) for {}: {} ({:.1f} of {:.1f} GiB free)",
          index_, bytes, bytes / 1048576.0, what, cudaGetErrorString(status),
          free_bytes / 1073741824.0, total_bytes / 1073741824.0));
    }
    SHARDLM_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream_));
    wait_for_stream(stream_, "allocate");
    return data;
  }

  // Never throws (called from destructors, possibly at exit after the runtime has
  // begun to unload): errors are dropped.
  void deallocate(void* data, size_t /*bytes*/) override {
    if (data == nullptr) return;
    (void)cudaSetDevice(index_);
    (void)cudaFree(data);
  }

 private:
  int index_;
  cudaStream_t stream_;
};

// A device buffer the backend grows for its own use (operand widening, reduction
// partials): stream-ordered allocation and release, so replacing a buffer never
// waits for the GPU and never frees memory a queued kernel still reads.
class StreamScratch {
 public:
  explicit StreamScratch(const char* what) : what_(what) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  void* grow_to(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return data_;
    release(stream);
    const size_t rounded = (bytes + 0xfffff) & ~static_cast<size_t>(0xfffff);  // whole MiB
    const cudaError_t status = cudaMallocAsync(&data_, rounded, stream);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      data_ = nullptr;
      throw Error(fmt::format("cuda: cannot allocate {} bytes of scratch for {}: {}", rounded,
                              what_, cudaGetErrorString(status)));
    }
    bytes_ = rounded;
    return data_;
  }
  void release(cudaStream_t stream) {
    if (data_ != nullptr) (void)cudaFreeAsync(data_, stream);
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  const char* what_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// What identifies a cuBLASLt plan: shape, strides, operand type, compute mode and the
// operands' alignment (heuristics depend on all of them).
struct GemmKey {
  bool trans_a, trans_b;
  int M, N, K, lda, ldb, ldc;
  DType type;
  bool tf32;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(trans_a, trans_b, M, N, K, lda, ldb, ldc, type, tf32, align_a, align_b,
                    align_c);
  }
  bool operator<(const GemmKey& other) const { return tie() < other.tie(); }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
};

void destroy_plan(GemmPlan& plan) {
  if (plan.a != nullptr) (void)cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) (void)cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c != nullptr) (void)cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc != nullptr) (void)cublasLtMatmulDescDestroy(plan.desc);
  plan = GemmPlan{};
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index) : index_(index) {
    SHARDLM_CUDA_CHECK(cudaSetDevice(index_));
    cudaDeviceProp props{};
    SHARDLM_CUDA_CHECK(cudaGetDeviceProperties(&props, index_));
    name_ = props.name;
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    allocator_ = std::make_unique<CudaAllocator>(index_, stream_);
    SHARDLM_CUBLAS_CHECK(cublasLtCreate(&lt_));
    SHARDLM_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    SHARDLM_CUDA_CHECK(cudaMalloc(&sum_partials_, (kernels::kSumBlocks + 1) * sizeof(double)));
    SHARDLM_CUDA_CHECK(cudaMallocHost(&host_result_, sizeof(double)));
    for (StagingSlot& slot : staging_) {
      SHARDLM_CUDA_CHECK(cudaMallocHost(&slot.data, kStagingSlotBytes));
      SHARDLM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    }
    tf32_ = env_flag("SHARDLM_CUDA_TF32");
    (void)stream_wait_timeout_seconds();  // a bad SHARDLM_CUDA_STREAM_TIMEOUT fails here
  }

  // Never throws: the process-wide backends are destroyed at exit, possibly after the
  // CUDA runtime has begun to unload, so errors are dropped.
  // (cudaFree waits for the device's work; the stream is destroyed once its work ends.)
  ~CudaBackend() override {
    (void)cudaSetDevice(index_);
    for (auto& [key, plan] : plans_) destroy_plan(plan);
    widened_a_.release(stream_);
    widened_b_.release(stream_);
    column_partials_.release(stream_);
    embedding_order_.release(stream_);
    gqa_slots_.release(stream_);
    if (lt_ != nullptr) (void)cublasLtDestroy(lt_);
    (void)cudaFree(workspace_);
    (void)cudaFree(sum_partials_);
    (void)cudaFreeHost(host_result_);
    (void)cudaStreamSynchronize(stream_);  // the staging slots' copies are done with them
    for (StagingSlot& slot : staging_) {
      if (slot.copied != nullptr) (void)cudaEventDestroy(slot.copied);
      (void)cudaFreeHost(slot.data);
    }
    (void)cudaStreamDestroy(stream_);
  }

  Device device() const override { return {DeviceKind::cuda, index_}; }
  void* stream_handle() const override { return stream_; }
  std::string description() const override {
    return fmt::format("cuda:{} ({}, cuBLASLt{})", index_, name_, tf32_ ? ", TF32" : "");
  }
  DeviceAllocator& allocator() override { return *allocator_; }

  // --- memory movement -------------------------------------------------------------------
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    select();
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    select();
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    wait_for_stream(stream_, "copy_to_host");
  }
  // The caller may reuse its buffer once this returns. Small copies (a micro-batch's
  // token, target and position arrays) go through the pinned staging ring and stay on
  // the stream; larger ones are queued and waited for (cudaMemcpyAsync from pinned
  // memory returns before the copy has read the source).
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    select();
    if (bytes <= kStagingSlotBytes) {
      StagingSlot& slot = staging_[next_staging_slot_];
      next_staging_slot_ = (next_staging_slot_ + 1) % staging_.size();
      wait_for_event(slot.copied, "copy_from_host (a staging slot's previous copy)");
      std::memcpy(slot.data, host_src, bytes);
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, slot.data, bytes, cudaMemcpyHostToDevice, stream_));
      SHARDLM_CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
      return;
    }
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    wait_for_stream(stream_, "copy_from_host");
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes == 0) return;
    select();
    SHARDLM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void synchronize() override {
    select();
    wait_for_stream(stream_, "synchronize");
  }

  // --- GEMM and conversions -----------------------------------------------------------------
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, ConstTypedPtr A, int lda,
            ConstTypedPtr B, int ldb, float beta, float* C, int ldc) override {
    cpu::check_gemm_arguments("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return;
    select();
    if (K == 0) {  // C = beta C (cuBLASLt does not take K = 0)
      SHARDLM_CUDA_CHECK(kernels::scale_rows(stream_, C, ldc, M, N, beta));
      return;
    }
    // Two 16-bit operands of one type: cuBLASLt's bf16 / fp16 kernels, fp32 accumulation.
    if (A.dtype == B.dtype && A.dtype != DType::fp32 &&
        lt_matmul(trans_a, trans_b, M, N, K, alpha, A.data, lda, B.data, ldb, A.dtype, beta, C,
                  ldc))
      return;
    // Otherwise (mixed types, or no 16-bit kernel for these strides) every non-fp32
    // operand is widened (exactly) into a compact fp32 scratch, as cpu::gemm_mixed does:
    // the product of the rounded inputs, accumulated in fp32.
    const void* a = A.data;
    const void* b = B.data;
    if (A.dtype != DType::fp32) {
      const int rows = trans_a ? K : M, cols = trans_a ? M : K;
      a = widen(widened_a_, A, lda, rows, cols);
      lda = cols;
    }
    if (B.dtype != DType::fp32) {
      const int rows = trans_b ? N : K, cols = trans_b ? K : N;
      b = widen(widened_b_, B, ldb, rows, cols);
      ldb = cols;
    }
    const bool ran =
        lt_matmul(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, DType::fp32, beta, C, ldc);
    SHARDLM_CHECK(ran,
                  "cuda gemm: cuBLASLt has no fp32 algorithm for M={} N={} K={} (lda {} ldb {} "
                  "ldc {}, trans {} {})",
                  M, N, K, lda, ldb, ldc, trans_a, trans_b);
  }
  void convert(TypedPtr dst, ConstTypedPtr src, int64_t n) override {
    if (n <= 0) return;
    select();
    if (dst.dtype == src.dtype) {
      copy(dst.data, src.data, static_cast<size_t>(n) * dtype_bytes(dst.dtype));
      return;
    }
    SHARDLM_CUDA_CHECK(kernels::convert(stream_, dst, src, n));
  }
  void convert_rows(TypedPtr dst, int64_t ld_dst, ConstTypedPtr src, int64_t ld_src, int64_t rows,
                    int64_t cols) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::convert_rows(stream_, dst, ld_dst, src, ld_src, rows, cols));
  }
  void round_to(DType dtype, float* dst, const float* src, int64_t n) override {
    if (n <= 0) return;
    select();
    if (dtype == DType::fp32) {
      if (dst != src) copy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    SHARDLM_CUDA_CHECK(kernels::round_to(stream_, dtype, dst, src, n));
  }

  void accumulate(float* dst, const float* src, int64_t n) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::accumulate(stream_, dst, src, n));
  }

  // --- elementwise around GEMMs -----------------------------------------------------------------
  void add_bias(float* out, const float* bias, int64_t N, int M) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::add_bias_inplace(stream_, out, bias, N, M));
  }
  void add_bias(TypedPtr out, const float* in, const float* bias, int64_t N, int M) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::add_bias(stream_, out, in, bias, N, M));
  }
  void residual_add_bias(float* out, const float* a, const float* branch, const float* bias,
                         int64_t N, int M) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::residual_add_bias(stream_, out, a, branch, bias, N, M));
  }
  void bias_backward(float* dbias, const float* dout, int64_t N, int M) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::bias_backward(stream_, dbias, dout, N, M, partials_for(N, M, 1)));
  }
  void bias_gelu_forward(TypedPtr out, TypedPtr pre_out, const float* pre_in, const float* bias,
                         int64_t N, int M) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::bias_gelu_forward(stream_, out, pre_out, pre_in, bias, N, M));
  }
  void gelu_backward(float* dinp, const float* dout, ConstTypedPtr pre, int64_t count) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::gelu_backward(stream_, dinp, dout, pre, count));
  }
  void swiglu_forward(TypedPtr h, TypedPtr gate_up_out, const float* gate_up_in, int64_t N,
                      int I) override {
    SHARDLM_CHECK(N >= 0 && I > 0, "swiglu: {} rows of intermediate size {}; expected I > 0", N, I);
    select();
    SHARDLM_CUDA_CHECK(kernels::swiglu_forward(stream_, h, gate_up_out, gate_up_in, N, I));
  }
  void swiglu_backward(float* dgate_up, const float* dh, ConstTypedPtr gate_up, int64_t N,
                       int I) override {
    SHARDLM_CHECK(N >= 0 && I > 0, "swiglu: {} rows of intermediate size {}; expected I > 0", N, I);
    select();
    SHARDLM_CUDA_CHECK(kernels::swiglu_backward(stream_, dgate_up, dh, gate_up, N, I));
  }

  // --- norms -------------------------------------------------------------------------------------
  void layernorm_forward(TypedPtr out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t N, int C) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::layernorm_forward(stream_, out, mean, rstd, nullptr, inp, nullptr,
                                                  nullptr, weight, bias, N, C, cpu::kLayerNormEps));
  }
  void residual_layernorm_forward(float* residual, TypedPtr out, float* mean, float* rstd,
                                  const float* a, const float* branch, const float* branch_bias,
                                  const float* weight, const float* bias, int64_t N,
                                  int C) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::layernorm_forward(stream_, out, mean, rstd, residual, a, branch,
                                                  branch_bias, weight, bias, N, C,
                                                  cpu::kLayerNormEps));
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t N, int C) override {
    select();
    SHARDLM_CUDA_CHECK(
        kernels::layernorm_backward_input(stream_, dinp, dout, inp, weight, mean, rstd, N, C));
    SHARDLM_CUDA_CHECK(kernels::layernorm_backward_params(stream_, dweight, dbias, dout, inp, mean,
                                                          rstd, N, C, partials_for(N, C, 2)));
  }
  void rmsnorm_forward(TypedPtr y, int64_t ld_y, float* rstd, ConstTypedPtr x, int64_t ld_x,
                       const float* weight, const RmsNormShape& shape, float eps) override {
    check_rmsnorm_shape(shape, ld_y, ld_x, eps);
    select();
    SHARDLM_CUDA_CHECK(
        kernels::rmsnorm_forward(stream_, y, ld_y, rstd, x, ld_x, weight, shape, eps));
  }
  void residual_rmsnorm_forward(float* residual, TypedPtr y, float* rstd, const float* a,
                                const float* branch, const float* branch_bias, const float* weight,
                                int64_t N, int C, float eps) override {
    check_rmsnorm_shape({N, 1, C}, C, C, eps);
    select();
    SHARDLM_CUDA_CHECK(kernels::residual_rmsnorm_forward(stream_, residual, y, rstd, a, branch,
                                                         branch_bias, weight, N, C, eps));
  }
  void rmsnorm_backward(float* dx, int64_t ld_dx, float* dweight, const float* dy, int64_t ld_dy,
                        ConstTypedPtr x, int64_t ld_x, const float* weight, const float* rstd,
                        const RmsNormShape& shape, bool accumulate_dx) override {
    check_rmsnorm_shape(shape, ld_dx, ld_dy, 0.0f);
    check_rmsnorm_shape(shape, ld_x, ld_x, 0.0f);
    select();
    SHARDLM_CUDA_CHECK(kernels::rmsnorm_backward_input(stream_, dx, ld_dx, dy, ld_dy, x, ld_x,
                                                       weight, rstd, shape, accumulate_dx));
    if (dweight != nullptr)  // null: a frozen weight
      SHARDLM_CUDA_CHECK(
          kernels::rmsnorm_backward_weight(stream_, dweight, dy, ld_dy, x, ld_x, rstd, shape,
                                           partials_for(shape.rows * shape.heads, shape.dim, 1)));
  }

  // --- positions, attention, embeddings ---------------------------------------------------------
  void rope_forward(TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x, int64_t rows, int heads,
                    int head_dim, const int32_t* positions, const RopeTableView& table) override {
    check_rope_shape(ld_y, ld_x, rows, heads, head_dim, table);
    select();
    SHARDLM_CUDA_CHECK(kernels::rope_rotate(stream_, y, ld_y, x, ld_x, rows, heads, head_dim,
                                            positions, table, 1.0f));
  }
  void rope_backward(float* dx, int64_t ld_dx, const float* dy, int64_t ld_dy, int64_t rows,
                     int heads, int head_dim, const int32_t* positions,
                     const RopeTableView& table) override {
    check_rope_shape(ld_dx, ld_dy, rows, heads, head_dim, table);
    select();
    SHARDLM_CUDA_CHECK(kernels::rope_rotate(stream_, dx, ld_dx, dy, ld_dy, rows, heads, head_dim,
                                            positions, table, -1.0f));
  }
  void attention_forward(TypedPtr out, float* lse, ConstTypedPtr qkv, const AttentionShape& s,
                         const int32_t* key_begin) override {
    select();
    cuda::attention_forward(stream_, out, lse, qkv, s, key_begin);
  }
  void attention_forward_cached(TypedPtr out, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr k, ConstTypedPtr v,
                                int64_t ld_kv, const AttentionShape& s, int past) override {
    select();
    cuda::attention_forward_cached(stream_, out, q, ld_q, k, v, ld_kv, s, past);
  }
  void attention_backward(float* dqkv, const float* dout, ConstTypedPtr qkv, ConstTypedPtr out,
                          const float* lse, const AttentionShape& s,
                          const int32_t* key_begin) override {
    select();
    const size_t scratch_bytes = cuda::attention_backward_scratch_bytes(s);
    float* scratch = scratch_bytes == 0 ? nullptr
                                        : static_cast<float*>(gqa_slots_.grow_to(scratch_bytes, stream_));
    cuda::attention_backward(stream_, dqkv, dout, qkv, out, lse, s, key_begin, scratch);
  }
  void attention_block_forward(float* out, float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                               const AttentionBlockShape& s, const int32_t* key_range) override {
    select();
    cuda::attention_block_forward(stream_, out, lse, q, ld_q, kv, s, key_range);
  }
  void attention_block_backward(float* dq, float* dkv, const float* dout, ConstTypedPtr out,
                                const float* lse, ConstTypedPtr q, int64_t ld_q, ConstTypedPtr kv,
                                const AttentionBlockShape& s, const int32_t* key_range) override {
    select();
    cuda::attention_block_backward(stream_, dq, dkv, dout, out, lse, q, ld_q, kv, s, key_range);
  }
  void attention_lse_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                           const AttentionBlockShape& s) override {
    select();
    cuda::attention_lse_merge(stream_, out, lse, block_out, block_lse, s);
  }
  void embedding_forward(float* out, const int32_t* tokens, ConstTypedPtr wte, ConstTypedPtr wpe,
                         int B, int T, int C, DType value_type, const int32_t* positions) override {
    select();
    SHARDLM_CUDA_CHECK(
        kernels::embedding_forward(stream_, out, tokens, wte, wpe, B, T, C, value_type, positions));
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                          int T, int C, const int32_t* positions) override {
    const int64_t rows = static_cast<int64_t>(B) * T;
    SHARDLM_CHECK(rows < INT32_MAX, "cuda embedding_backward: {} x {} rows; expected fewer than 2^31",
                  B, T);
    select();
    auto* order = static_cast<int32_t*>(
        embedding_order_.grow_to(2 * static_cast<size_t>(rows) * sizeof(int32_t), stream_));
    SHARDLM_CUDA_CHECK(kernels::embedding_backward(stream_, dwte, dwpe, dout, tokens, B, T, C,
                                                   positions, order));
  }

  // --- loss --------------------------------------------------------------------------------------
  // cpu::lm_head_cross_entropy's order, chunk by chunk: logits = x W^T (first V rows of
  // W), the rows' losses and (in place) dlogits, then dx = dlogits W (overwritten) and
  // dW += dlogits^T x. The CPU skips a chunk whose targets are all ignored; here the
  // targets are on the device, so such a chunk runs and gives the same zeros (ignored
  // rows have zero loss and zero dlogits).
  void lm_head_cross_entropy(const LmHeadLossArgs& a, float* losses, float* dx,
                             float* dweight) override {
    const bool want_grad = dx != nullptr;
    const bool round_dlogits = a.x.dtype != DType::fp32;
    check_lm_head_args(a, want_grad);
    SHARDLM_CHECK(a.logits_stride <= INT32_MAX, "lm head: logits stride {} beyond int range",
                  a.logits_stride);
    select();
    const int ld = static_cast<int>(a.logits_stride);
    for (int64_t r0 = 0; r0 < a.N; r0 += a.chunk_rows) {
      const int rows = static_cast<int>(std::min<int64_t>(a.chunk_rows, a.N - r0));
      const ConstTypedPtr x = a.x.at(r0 * a.C);
      float* logits = a.logits_scratch;
      gemm(false, true, rows, a.V, a.C, 1.0f, x, a.C, a.weight, a.C, 0.0f, logits, ld);
      cuda::cross_entropy_rows(stream_, logits, a.logits_stride, a.targets + r0, rows, a.V,
                               a.grad_scale, losses + r0, want_grad);
      SHARDLM_CUDA_CHECK(cudaGetLastError());
      if (!want_grad) continue;
      ConstTypedPtr dlogits = logits;
      if (round_dlogits) {
        SHARDLM_CUDA_CHECK(kernels::convert_rows(stream_, a.dlogits_scratch, a.logits_stride,
                                                 logits, a.logits_stride, rows, a.V));
        dlogits = a.dlogits_scratch;
      }
      gemm(false, false, rows, a.C, a.V, 1.0f, dlogits, ld, a.weight, a.C, 0.0f, dx + r0 * a.C,
           a.C);
      if (dweight != nullptr)  // null: a frozen head (LoRA)
        gemm(true, false, a.V, a.C, rows, 1.0f, dlogits, ld, x, a.C, 1.0f, dweight, a.C);
    }
  }
  double sum(const float* data, int64_t n) override { return device_sum(data, n, false); }

  void vocab_shard_localize(int32_t* local_tokens, const int32_t* tokens, int64_t n,
                            VocabShardRows shard) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::vocab_shard_localize(stream_, local_tokens, tokens, n, shard));
  }
  void vocab_shard_mask_rows(float* rows, const int32_t* tokens, int64_t n, int C,
                             VocabShardRows shard) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::vocab_shard_mask_rows(stream_, rows, tokens, n, C, shard));
  }
  void vocab_shard_row_max(float* row_max, const float* logits, int64_t ld, int rows,
                           VocabShardRows shard) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::vocab_shard_row_max(stream_, row_max, logits, ld, rows, shard));
  }
  void vocab_shard_softmax_sums(float* sums, float* logits, int64_t ld, const float* row_max,
                                const int32_t* targets, int rows, VocabShardRows shard) override {
    select();
    SHARDLM_CUDA_CHECK(
        kernels::vocab_shard_softmax_sums(stream_, sums, logits, ld, row_max, targets, rows, shard));
  }
  void vocab_shard_loss(float* losses, const float* row_max, const float* sums,
                        const int32_t* targets, int rows) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::vocab_shard_loss(stream_, losses, row_max, sums, targets, rows));
  }
  void vocab_shard_softmax_backward(float* logits, int64_t ld, const float* sums,
                                    const int32_t* targets, int rows, float grad_scale,
                                    VocabShardRows shard) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::vocab_shard_softmax_backward(stream_, logits, ld, sums, targets,
                                                             rows, grad_scale, shard));
  }

  // --- quantized weights
  // ---------------------------------------------------------------------------
  void gather_rows(TypedPtr dst, ConstTypedPtr src, const int32_t* index, int64_t rows,
                   int64_t width) override {
    SHARDLM_CHECK(dst.dtype == src.dtype, "gather_rows: {} rows into {} (one storage type)",
                  dtype_name(src.dtype), dtype_name(dst.dtype));
    select();
    SHARDLM_CUDA_CHECK(kernels::gather_rows(stream_, dst, src, index, rows, width));
  }
  void scatter_add_rows(float* out, const float* src, const int32_t* index, const float* weight,
                        int64_t rows, int64_t width) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::scatter_add_rows(stream_, out, src, index, weight, rows, width));
  }
  void moe_assignment_weights(float* weight, const float* top_weight, const int32_t* token,
                              const int32_t* slot, int k, int64_t rows) override {
    select();
    SHARDLM_CUDA_CHECK(
        kernels::moe_assignment_weights(stream_, weight, top_weight, token, slot, k, rows));
  }
  void moe_scatter_weight_grads(float* d_top_weight, const float* dot, const int32_t* token,
                                const int32_t* slot, int k, int64_t rows) override {
    select();
    SHARDLM_CUDA_CHECK(
        kernels::moe_scatter_weight_grads(stream_, d_top_weight, dot, token, slot, k, rows));
  }
  void moe_weight_backward(float* dot, float* g, const float* act, int64_t I, float* dy, int64_t C,
                           const float* weight, int64_t rows) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::moe_weight_backward(stream_, dot, g, act, I, dy, C, weight, rows));
  }
  void moe_router_backward(float* dlogits, const float* probs, const int32_t* top_expert,
                           const float* d_top_weight, const float* aux_dprob, int64_t n, int E,
                           int k, bool norm_topk_prob) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::moe_router_backward(stream_, dlogits, probs, top_expert,
                                                    d_top_weight, aux_dprob, n, E, k,
                                                    norm_topk_prob));
  }
  void shared_expert_gate_forward(float* gate, float* y, const float* out, int64_t n,
                                  int64_t C) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::shared_expert_gate_forward(stream_, gate, y, out, n, C));
  }
  void shared_expert_gate_backward(float* dz, float* ds, const float* dy, const float* gate,
                                   const float* out, int64_t n, int64_t C) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::shared_expert_gate_backward(stream_, dz, ds, dy, gate, out, n, C));
  }

  void nf4_dequantize(const void* in, int64_t n, TypedPtr out) override {
    select();
    SHARDLM_CUDA_CHECK(kernels::nf4_dequantize(stream_, in, n, out));
  }

  // --- optimizer
  // -----------------------------------------------------------------------------------
  // backend/cpu/adamw.cpp's constants, computed the same way; the decay ranges (host memory)
  // go to the launcher, which carries them in its launches' arguments.
  void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                    std::span<const ElementRange> decay_ranges, float lr, float grad_multiplier,
                    int64_t step, const AdamWConfig& config, TypedPtr rounded_params) override {
    if (n <= 0) return;
    select();
    const double bias1 =
        1.0 - std::pow(static_cast<double>(config.beta1), static_cast<double>(step));
    const double bias2 =
        1.0 - std::pow(static_cast<double>(config.beta2), static_cast<double>(step));
    const float step_size = static_cast<float>(lr / bias1);
    const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    const float decay_factor = 1.0f - lr * config.weight_decay;
    const kernels::AdamConstants plain{1.0f,         grad_multiplier,     config.beta1,
                                       config.beta2, 1.0f - config.beta1, 1.0f - config.beta2,
                                       step_size,    bias2_sqrt,          config.eps};
    kernels::AdamConstants decayed = plain;
    decayed.decay_factor = decay_factor;
    ranges_.clear();
    for (const ElementRange& r : decay_ranges) ranges_.push_back({r.begin, r.end});
    SHARDLM_CUDA_CHECK(kernels::adamw_update(stream_, params, grads, m, v, n, ranges_.data(),
                                             ranges_.size(), plain, decayed, rounded_params));
  }
  double sum_of_squares(const float* data, int64_t n) override { return device_sum(data, n, true); }

 private:
  static constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's, allocated once
  // The staging ring of small host-to-device copies: a slot is reused once the copy
  // queued from it has run (its event), 8 copies later, so the host rarely waits.
  static constexpr size_t kStagingSlotBytes = 1u << 20;
  struct StagingSlot {
    void* data = nullptr;           // pinned
    cudaEvent_t copied = nullptr;  // recorded after the copy from it
  };

  // Kernels launch on the calling thread's current device: a thread that drives several
  // GPUs (tests, a threads launcher) must select ours first (cheap when it already is).
  void select() const { SHARDLM_CUDA_CHECK(cudaSetDevice(index_)); }

  double* partials_for(int64_t rows, int64_t cols, int outputs) {
    return static_cast<double*>(
        column_partials_.grow_to(kernels::column_sum_partial_bytes(rows, cols, outputs), stream_));
  }

  // The stored [rows, cols] operand (row stride ld) widened into a compact fp32 scratch.
  const float* widen(StreamScratch& scratch, ConstTypedPtr operand, int ld, int rows, int cols) {
    auto* wide = static_cast<float*>(
        scratch.grow_to(static_cast<size_t>(rows) * cols * sizeof(float), stream_));
    SHARDLM_CUDA_CHECK(
        kernels::convert_rows(stream_, TypedPtr(wide), cols, operand, ld, rows, cols));
    return wide;
  }

  double device_sum(const float* data, int64_t n, bool squares) {
    if (n <= 0) return 0.0;
    select();
    double* result = sum_partials_ + kernels::kSumBlocks;
    SHARDLM_CUDA_CHECK(kernels::sum(stream_, data, n, squares, sum_partials_, result));
    SHARDLM_CUDA_CHECK(
        cudaMemcpyAsync(host_result_, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    wait_for_stream(stream_, squares ? "sum_of_squares" : "sum");
    return *host_result_;
  }

  // Row-major C[M,N] = alpha op(A) op(B) + beta C through column-major cuBLASLt: a
  // row-major [r, c] matrix with stride ld is the column-major [c, r] matrix with leading
  // dimension ld, i.e. its transpose. So C^T = op(B)^T op(A)^T is computed in column
  // major: cuBLASLt's first operand is B's memory, its second A's, and the transposition
  // flags carry over unchanged. Returns false when cuBLASLt offers no algorithm (the
  // caller falls back or reports it). beta == 0: cuBLAS's documented BLAS contract is
  // that C need not be a valid input then; test_backend_ops checks NaN garbage in C.
  bool lt_matmul(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A,
                 int lda, const void* B, int ldb, DType type, float beta, float* C, int ldc) {
    const bool tf32 = type == DType::fp32 && tf32_;
    const GemmKey key{
        trans_a,         trans_b,        M, N, K, lda, ldb, ldc, type, tf32, alignment_of(A),
        alignment_of(B), alignment_of(C)};
    auto found = plans_.find(key);
    if (found == plans_.end()) found = plans_.emplace(key, make_plan(key)).first;
    const GemmPlan& plan = found->second;
    if (!plan.has_algo) return false;
    SHARDLM_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, B, plan.a, A, plan.b, &beta, C,
                                        plan.c, C, plan.c, &plan.algo, workspace_, kWorkspaceBytes,
                                        stream_));
    return true;
  }

  GemmPlan make_plan(const GemmKey& k) {
    GemmPlan plan;
    try {
      fill_plan(k, plan);
    } catch (...) {
      destroy_plan(plan);
      throw;
    }
    return plan;
  }

  void fill_plan(const GemmKey& k, GemmPlan& plan) {
    const cublasComputeType_t compute = k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
    const cublasOperation_t op_first = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // B's memory
    const cublasOperation_t op_second = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // A's memory
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &op_first, sizeof(op_first)));
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &op_second, sizeof(op_second)));
    // Stored (pre-op) shapes in column-major terms: B's memory is [trans_b ? K : N rows,
    // trans_b ? N : K cols] with leading dimension ldb; A's is [trans_a ? M : K,
    // trans_a ? K : M] with lda; C is [N, M] with ldc.
    const cudaDataType_t operand = cuda_type(k.type);
    SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, operand, k.trans_b ? k.K : k.N,
                                                    k.trans_b ? k.N : k.K, k.ldb));
    SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, operand, k.trans_a ? k.M : k.K,
                                                    k.trans_a ? k.K : k.M, k.lda));
    SHARDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, k.N, k.M, k.ldc));

    cublasLtMatmulPreference_t preference = nullptr;
    SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace = kWorkspaceBytes;
    const uint32_t align_first = k.align_b, align_second = k.align_a, align_c = k.align_c;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    try {
      SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
      SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first,
          sizeof(align_first)));
      SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second,
          sizeof(align_second)));
      SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
      SHARDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
      // NOT_SUPPORTED here means "no algorithm for this problem": a plan without one.
      const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
          lt_, plan.desc, plan.a, plan.b, plan.c, plan.c, preference, 1, &result, &found);
      if (status != CUBLAS_STATUS_NOT_SUPPORTED) SHARDLM_CUBLAS_CHECK(status);
    } catch (...) {
      (void)cublasLtMatmulPreferenceDestroy(preference);
      throw;
    }
    (void)cublasLtMatmulPreferenceDestroy(preference);
    plan.has_algo = found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan.has_algo) plan.algo = result.algo;
  }

  int index_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaAllocator> allocator_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  bool tf32_ = false;
  std::map<GemmKey, GemmPlan> plans_;
  StreamScratch widened_a_{"gemm operand A widened to fp32"};
  StreamScratch widened_b_{"gemm operand B widened to fp32"};
  StreamScratch column_partials_{"parameter-gradient column sums"};
  StreamScratch embedding_order_{"the embedding backward's token order"};
  StreamScratch gqa_slots_{"the GQA attention backward's per-query-head k and v gradients"};
  std::vector<kernels::HostRange> ranges_;  // adamw_update's decay ranges, reused
  double* sum_partials_ = nullptr;          // kSumBlocks partial sums, then the result
  double* host_result_ = nullptr;   // pinned: the result's copy to the host
  std::array<StagingSlot, 8> staging_{};
  size_t next_staging_slot_ = 0;
};

}  // namespace

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: not an error for the caller
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_backend(int index) {
  const int count = visible_device_count();
  SHARDLM_CHECK(index >= 0 && index < count,
                "cuda:{}: this machine has {} CUDA device(s) visible (expected an index below "
                "that; check CUDA_VISIBLE_DEVICES and the driver)",
                index, count);
  return std::make_unique<CudaBackend>(index);
}

}  // namespace shardlm::cuda
