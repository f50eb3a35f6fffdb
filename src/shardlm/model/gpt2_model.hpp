// Gpt2Model: explicit forward and backward of GPT-2, one unit at a time (no autograd).
//
// The model owns no parameters: the caller (the trainer, through a parallel
// Strategy) hands it, per call, a pointer to each unit's full flat parameter buffer
// and gradient buffer (ParamLayout). Under ZeRO-3 those point into gather buffers
// that exist only around the call, which is why they are arguments, not members.
//
// Units: 0 = embeddings (wte, wpe), 1..L = blocks, L+1 = final (ln_f; the LM head
// is tied to wte, so the final unit also reads unit 0: see units_needed_for).
//
// A training micro-batch:
//   for u in 0..L+1:   forward_unit(u, ...)     // final unit: ln_f + fused head/CE
//   for u in L+1..0:   backward_unit(u, ...)    // gradients ACCUMULATE (+=) into grads
// The loss is the sum of cross-entropy over targets != kIgnoreIndex, multiplied by
// grad_scale for the gradient (grad_scale = 1 / global count of target tokens, so
// that micro-batches and ranks sum to the global mean; times the loss scale in fp16).
//
// ModelOptions (properties of the run, fixed at construction):
//  - precision: fp32, or bf16/fp16 compute. Every parameter is used rounded to the
//    compute type (matrices, biases, LayerNorm weights, embeddings: what PyTorch
//    FSDP's param_dtype does). Parameters arrive either as fp32 master weights, which
//    the model rounds once per use of a unit (forward; backward, which also serves
//    the recompute), or already in the compute type (ZeRO-3 gathers them so, at half
//    the bytes; the replicated strategies keep a bf16 copy in bf16 runs); both give
//    bitwise the same result. GEMMs read compute-type inputs
//    and accumulate and write fp32.
//    The activations kept for backward are stored in the compute type (ln_1, qkv,
//    attention output, ln_2, GELU input and output, ln_f), except the residual
//    stream; LayerNorm and softmax statistics, the loss, all reductions and the
//    parameter gradients are fp32. Kernels compute in fp32 on the stored (rounded)
//    values, so backward sees exactly what forward used. The activation gradients
//    that feed GEMMs are rounded to the compute type too (as autocast does). fp16
//    keeps weights as fp32 values rounded to fp16 (no CPU here multiplies fp16; the
//    GEMM widens its fp16 activations), so it saves activation memory, not time.
//  - activation_checkpointing: only the unit boundaries (each block's input, the
//    residual stream) are kept per layer; one shared set of block activations is
//    refilled by recomputing block l's forward (all but its last GEMM, whose output
//    backward does not need) right before block l's backward. Same kernels in the
//    same order: gradients are bitwise identical to running without it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "shardlm/core/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

inline constexpr int32_t kIgnoreIndex = -1;

// One pointer per unit (index = unit). Entries for units a call does not need may be
// null.
using UnitPointers = std::span<float* const>;
// Parameters, one per unit, each fp32 or in the run's compute type.
using ParamPointers = std::span<const ConstTypedPtr>;

struct MicroBatch {
  const int32_t* tokens = nullptr;   // [B, T], ids < vocab_size
  const int32_t* targets = nullptr;  // [B, T], ids < vocab_size or kIgnoreIndex; may be null
                                     // when no loss is wanted (sampling)
  int B = 0;
  int T = 0;
};

struct ModelOptions {
  DType precision = DType::fp32;
  bool activation_checkpointing = false;
};

// What a model allocates (bytes), for `shardlm plan`.
struct ModelMemoryPlan {
  int64_t activations = 0;     // the arena (MemCategory::activations)
  int64_t params_scratch = 0;  // rounding scratch (MemCategory::params)
};

class Gpt2Model {
 public:
  // Activation memory is sized once for (max_batch, max_seq) and tracked under
  // MemCategory::activations. With a compute type other than fp32 a unit's vectors
  // (13 C floats) are rounded into a scratch, and fp32 weights into a weight scratch
  // sized for the larger of a block's matrices and the LM head, allocated by the first
  // call that needs it (never when weights arrive in the compute type); both are
  // tracked under MemCategory::params. Nothing else is allocated in forward/backward.
  Gpt2Model(const ModelConfig& config, const ParamLayout& layout, int max_batch, int max_seq,
            MemoryTracker& tracker = MemoryTracker::global());
  Gpt2Model(const ModelConfig& config, const ParamLayout& layout, int max_batch, int max_seq,
            const ModelOptions& options, MemoryTracker& tracker = MemoryTracker::global());
  ~Gpt2Model();

  // Bytes the constructor and the first step allocate, without building the model.
  // params_in_compute_type: the strategy hands the model parameters in the compute
  // type (ZeRO-3/hybrid gathering them so, or any strategy's bf16 copy), which
  // spares the weight scratch.
  static ModelMemoryPlan plan_memory(const ModelConfig& config, int max_batch, int max_seq,
                                     const ModelOptions& options, bool params_in_compute_type);
  // units_needed_for() of every unit, from the config alone.
  static std::vector<std::vector<int>> unit_needs(const ModelConfig& config);
  Gpt2Model(const Gpt2Model&) = delete;
  Gpt2Model& operator=(const Gpt2Model&) = delete;

  const ModelConfig& config() const;
  const ParamLayout& layout() const;
  const ModelOptions& options() const;
  // Rows of logits the fused LM head computes at a time (its [rows, padded vocab]
  // fp32 chunk is all of the logits that ever exist).
  int logits_chunk_rows() const;
  int num_units() const;  // model units: n_layer + 2
  // Model units whose parameters model unit u's forward/backward read (final unit:
  // {0, final}). The per-unit pointers of every call are indexed by model unit.
  std::vector<int> units_needed_for(int unit) const;

  // Fill flat layout unit `unit`'s buffer (ParamLayout::units, which may hold several
  // model units) with GPT-2 init (per ParamInfo::init); padding and padded vocabulary
  // rows are zero. Deterministic in (seed, parameter name) only, so it does not
  // depend on world size or unit boundaries.
  void init_unit(int unit, uint64_t seed, float* unit_params) const;
  // Elements [begin, end) of that init into out[0, end - begin): a rank fills its owned
  // slice without a whole-unit scratch (bitwise the matching part of init_unit).
  void init_range(int unit, uint64_t seed, int64_t begin, int64_t end, float* out) const;

  // Forward of one unit for micro-batch `batch`. For the final unit with
  // batch.targets != null this also computes the loss; with training == true it
  // also computes the head's gradient (grad_scale-weighted) into grads[0] (+= wte)
  // and keeps what backward_unit(final) needs. grads may be empty when !training.
  void forward_unit(int unit, ParamPointers params, UnitPointers grads, const MicroBatch& batch,
                    bool training, float grad_scale);
  void backward_unit(int unit, ParamPointers params, UnitPointers grads, const MicroBatch& batch);
  // The same with fp32 parameters.
  void forward_unit(int unit, UnitPointers params, UnitPointers grads, const MicroBatch& batch,
                    bool training, float grad_scale);
  void backward_unit(int unit, UnitPointers params, UnitPointers grads, const MicroBatch& batch);

  // After forward of the final unit with targets: sum of CE over non-ignored targets
  // (double, unscaled) and the number of such targets.
  double last_loss_sum() const;
  int64_t last_target_count() const;

  // After forward of the final unit with targets == null: logits of position t of each
  // row, [B, vocab_size] (padded columns excluded), for sampling. Computed in the
  // compute type like the training head.
  void logits_at(ParamPointers params, int t, float* out) const;
  void logits_at(UnitPointers params, int t, float* out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm
