// Gpt2Model: explicit forward and backward of GPT-2, one unit at a time (no autograd),
// behind the Model interface (model/model.hpp: the calling contract).
//
// Units: 0 = embeddings (wte, wpe), 1..L = blocks, L+1 = final (ln_f; the LM head
// is tied to wte, so the final unit also reads unit 0: see units_needed_for).
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
#include <vector>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/model.hpp"

namespace shardlm {

class Gpt2Model final : public Model {
 public:
  // Activation memory is sized once for (max_batch, max_seq) and tracked under
  // MemCategory::activations. With a compute type other than fp32 a unit's vectors
  // (13 C floats) are rounded into a scratch, and fp32 weights into a weight scratch
  // sized for the larger of a block's matrices and the LM head, allocated by the first
  // call that needs it (never when weights arrive in the compute type); both are
  // tracked under MemCategory::params. Nothing else is allocated in forward/backward.
  Gpt2Model(const ModelConfig& config, const ParamLayout& layout, int max_batch, int max_seq,
            const ModelOptions& options = ModelOptions{},
            MemoryTracker& tracker = MemoryTracker::global());
  Gpt2Model(const ModelConfig& config, const ParamLayout& layout, int max_batch, int max_seq,
            MemoryTracker& tracker)
      : Gpt2Model(config, layout, max_batch, max_seq, ModelOptions{}, tracker) {}
  ~Gpt2Model() override;
  Gpt2Model(const Gpt2Model&) = delete;
  Gpt2Model& operator=(const Gpt2Model&) = delete;

  // Bytes the constructor and the first step allocate, without building the model.
  // params_in_compute_type: the strategy hands the model parameters in the compute
  // type (ZeRO-3/hybrid gathering them so, or any strategy's bf16 copy), which
  // spares the weight scratch.
  static ModelMemoryPlan plan_memory(const ModelConfig& config, int max_batch, int max_seq,
                                     const ModelOptions& options, bool params_in_compute_type);

  const ModelConfig& config() const override;
  const ParamLayout& layout() const override;
  const ModelOptions& options() const override;
  int logits_chunk_rows() const override;
  int num_units() const override;  // n_layer + 2
  std::vector<int> units_needed_for(int unit) const override;

  using Model::backward_unit;
  using Model::forward_unit;
  using Model::logits_at;
  void forward_unit(int unit, ParamPointers params, UnitPointers grads, const MicroBatch& batch,
                    bool training, float grad_scale) override;
  void backward_unit(int unit, ParamPointers params, UnitPointers grads,
                     const MicroBatch& batch) override;
  KvCache make_kv_cache(int capacity) const override;
  using Model::forward_unit_cached;
  void forward_unit_cached(int unit, ParamPointers params, KvCache& cache,
                           const MicroBatch& batch) override;
  double last_loss_sum() const override;
  int64_t last_target_count() const override;
  void logits_at(ParamPointers params, int t, float* out) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm
