// Pieces every family's model needs, written once: the activation arena carver, the
// rounding of parameters to the run's compute type, pointer and micro-batch checks,
// and the fused LM head + cross-entropy at the end of the last unit.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/model.hpp"

namespace shardlm {

// Carves 64-byte aligned arrays out of one tracked allocation: requests are recorded
// first, then one buffer of the summed size is allocated and handed out (so plan_memory
// can size the arena without allocating it).
class ArenaCarver {
 public:
  void request(float** slot, int64_t count);
  void request(int32_t** slot, int64_t count);
  void request(TypedPtr* slot, DType dtype, int64_t count);
  // `slot` gets the array handed to `same_as` (requested before; no bytes of its own).
  void share(TypedPtr* slot, const TypedPtr* same_as);
  int64_t bytes() const { return offset_; }
  // On the backend's device (host: counted by `tracker`).
  TrackedBuffer allocate(Backend& backend, MemoryTracker& tracker);

 private:
  static constexpr int64_t kAlignBytes = 64;
  struct Request {
    std::function<void(std::byte*)> assign;
    int64_t offset;
  };
  void add(std::function<void(std::byte*)> assign, int64_t bytes);
  std::vector<Request> requests_;
  int64_t offset_ = 0;
};

// Parameters as the kernels read them in a run of compute type `compute`: every
// parameter is used rounded to the compute type (what PyTorch FSDP's param_dtype does).
// GEMM weights are read in the weight type (the compute type, except fp16, which keeps
// fp16-rounded values in fp32: there is no fp16 GEMM to feed on a CPU); they pass
// through untouched when they arrive in that type (ZeRO-3 gathers so, the replicated
// strategies keep a bf16 copy), else they are converted into a weight scratch of
// `weight_scratch_elements`, allocated by the first call that needs it (never in a
// bf16 or fp32 run). Vectors (norm weights, biases) are fp32 values of the compute
// type, rounded into a vector scratch of `vector_scratch_floats` (compute != fp32 only).
class ParamRounding {
 public:
  ParamRounding(Backend& backend, DType compute, int64_t weight_scratch_elements,
                int64_t vector_scratch_floats, MemoryTracker& tracker);
  DType compute() const { return compute_; }
  DType weight_type() const { return weight_type_; }

  // count weights from src, converted at scratch_offset of the weight scratch if needed
  // (the scratch holds one unit's weights at a time).
  ConstTypedPtr gemm_weight(ConstTypedPtr src, int64_t scratch_offset, int64_t count) const;
  // A cursor into the vector scratch; vector_values moves it past what it rounds.
  float* vector_scratch() const { return vector_buffer_.as<float>(); }
  const float* vector_values(ConstTypedPtr src, int64_t count, float** scratch) const;
  // An fp32 activation (gradient) as a GEMM input: itself in fp32, else rounded into
  // `scratch`.
  ConstTypedPtr for_gemm(const float* src, TypedPtr scratch, int64_t count) const;

  // Bytes of the scratches, for plan_memory (params_in_compute_type: the weight scratch
  // is never allocated).
  static int64_t planned_bytes(DType compute, int64_t weight_scratch_elements,
                               int64_t vector_scratch_floats, bool params_in_compute_type);

 private:
  Backend* backend_;
  DType compute_;
  DType weight_type_;
  int64_t weight_scratch_elements_;
  MemoryTracker* tracker_;
  mutable TrackedBuffer weight_buffer_;
  TrackedBuffer vector_buffer_;
};

// out[rows, N] = alpha x[rows, K] op(W) + beta out, x's rows at stride lda (a forward
// GEMM: activations times a weight). One backend GEMM, or with row_by_row one M = 1
// GEMM per row (ModelOptions::row_by_row_gemm).
void forward_gemm(Backend& backend, bool row_by_row, bool trans_w, int rows, int N, int K,
                  float alpha, ConstTypedPtr x, int lda, ConstTypedPtr w, int ldw, float beta,
                  float* out, int ldc);

// The checks every family's forward_unit_cached makes when a step starts (unit 0):
// one sequence, no targets or packing, inside the cache and the model's sizes; returns
// the step's positions cache.length() + t.
std::vector<int32_t> start_cached_step(const MicroBatch& batch, const KvCache& cache,
                                       int layers, int64_t kv_width, DType compute, int max_seq,
                                       int vocab_size);

// Every model unit in `units` has a pointer, fp32 or in the compute type (Error otherwise).
void check_param_pointers(ParamPointers params, int num_units, const std::vector<int>& units,
                          int unit, DType compute);
void check_grad_pointer(UnitPointers grads, int num_units, int unit);
// The micro-batch that starts a forward: shape within what the model was built for and
// every token inside the vocabulary; packed-sequence arrays consistent.
void check_micro_batch(const MicroBatch& batch, int max_batch, int max_seq, int vocab_size);
// Targets inside the vocabulary or ignored; returns how many are not ignored.
int64_t count_targets(const int32_t* targets, int64_t n, int vocab_size);

// The micro-batch's int32 arrays where the kernels read them: on the host backend the
// caller's own arrays; on a device, copies in arrays carved from the model's arena
// (carve with on_device, which plan_memory counts too). The host arrays stay the ones
// the model checks and counts targets on.
class StagedBatch {
 public:
  void carve(ArenaCarver& carver, int64_t n, bool on_device);
  // default_positions: on a device, positions t when the batch has none (the host
  // path keeps its own default array).
  void stage(Backend& backend, const MicroBatch& batch, bool default_positions);
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* key_begin = nullptr;

 private:
  bool on_device_ = false;
  int32_t* device_tokens_ = nullptr;
  int32_t* device_targets_ = nullptr;
  int32_t* device_positions_ = nullptr;
  int32_t* device_key_begin_ = nullptr;
  std::vector<int32_t> host_positions_;
};

// Where a model is in one micro-batch: unit 0's forward starts it (and fixes its
// shape), the last unit's forward ends it (with the loss, when there are targets),
// and a training forward allows one backward pass, units in reverse order.
class MicroBatchState {
 public:
  explicit MicroBatchState(int num_units) : num_units_(num_units) {}
  void start(const MicroBatch& batch);
  // A forward of unit > 0 must see the shape unit 0 saw.
  void check_forward(int unit, const MicroBatch& batch) const;
  // The last unit's forward ran; training: its backward comes next.
  void finish_forward(bool training);
  // Backward of `unit` is the next one due (Error otherwise); advances past it.
  void begin_backward(int unit, const MicroBatch& batch);
  void check_logits_at(int t) const;

  int B = 0, T = 0;
  int64_t N() const { return static_cast<int64_t>(B) * T; }
  double loss_sum = 0.0;
  int64_t target_count = 0;

 private:
  int num_units_;
  bool have_batch_ = false;
  bool final_done_ = false;     // the last unit's forward ran for this batch (logits_at)
  int next_backward_unit_ = -1;  // -1: no backward pending
};

// The fused LM head + cross-entropy (backend/cpu/lm_head_loss.hpp) with its logits
// chunk: sized once, then run per micro-batch.
class LmHead {
 public:
  // Rows per logits chunk for n rows of a vocabulary padded to padded_vocab.
  static int chunk_rows_for(int64_t n, int padded_vocab);
  // Requests the head's arrays for up to n rows from the arena.
  void carve(ArenaCarver& carver, int64_t n, int vocab_size, int padded_vocab, int C, DType compute);
  int chunk_rows() const { return chunk_rows_; }

  // Loss of x [n, C] (compute type) against targets; with dx, the gradient of
  // grad_scale * sum(loss) with respect to x (fp32) and the head weight (+= dweight).
  // Returns the loss sum.
  // targets: the backend's memory.
  double loss(Backend& backend, ConstTypedPtr x, ConstTypedPtr weight, const int32_t* targets,
              int64_t n, float grad_scale, float* dx, float* dweight) const;
  // logits [rows, V] of `rows` hidden states at stride ld, into host memory `out` (on a
  // device through the logits chunk: rows must fit in it).
  void logits(Backend& backend, ConstTypedPtr x, int64_t ld, int rows, ConstTypedPtr weight,
              float* out) const;

 private:
  int V_ = 0, Vp_ = 0, C_ = 0, chunk_rows_ = 0;
  float* logits_chunk_ = nullptr;
  float* row_loss_ = nullptr;
  TypedPtr dlogits_c_;
};

}  // namespace shardlm
