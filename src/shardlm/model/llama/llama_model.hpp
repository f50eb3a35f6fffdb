// LlamaModel: explicit forward and backward of the Llama families (llama, qwen2,
// qwen3), one unit at a time, behind the Model interface (model/model.hpp: the
// calling contract; model/llama/llama_family.hpp: the tensors).
//
// Units: 0 = embeddings (embed_tokens), 1..L = decoder layers, L+1 = final (norm, and
// lm_head when untied; a tied head reads unit 0).
//
// A layer, per row x of the residual stream:
//   h = rmsnorm(x) * w_in
//   q|k|v = h Wqkv^T (+ b_qkv)                     one GEMM over the packed projections
//   q, k = rmsnorm_per_head(q) * w_q, ... (qwen3)  then rotary embedding of q and k
//   a = causal GQA attention(q, k, v)              flash-style, packed documents respected
//   r = x + a Wo^T (+ b_o);  h2 = rmsnorm(r) * w_post
//   g|u = h2 Wgu^T;  y = r + (silu(g) * u) Wdown^T
//
// Precision follows the GPT-2 model's rules (gpt2_model.hpp): parameters are used
// rounded to the compute type; the GEMM inputs kept for backward (h, q/k/v after
// RoPE, attention output, h2, g|u, silu(g)*u) and qwen3's pre-norm q/k are stored in
// it; the residual stream, statistics, loss and all gradients are fp32. Activation
// checkpointing keeps only each layer's input and recomputes the layer (all but its
// last GEMM) right before its backward: gradients are bitwise those without it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/model.hpp"

namespace shardlm {

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& config, const ParamLayout& layout, int max_batch, int max_seq,
             const ModelOptions& options = ModelOptions{},
             MemoryTracker& tracker = MemoryTracker::global());
  ~LlamaModel() override;
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

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
  double last_aux_loss() const override;
  std::vector<double> last_expert_tokens() const override;
  int64_t last_target_count() const override;
  void logits_at(ParamPointers params, int t, float* out) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm
