// Model: what the step loop, the strategies, checkpoints and `plan` know of a model
// (docs/architecture.md "The step"). A family (model/family.hpp) makes one; GPT-2 and the Llama
// families implement it in their own folders.
//
// A model owns no parameters: the caller (the trainer, through a parallel Strategy)
// hands it, per call, one pointer per model unit to that unit's parameters and
// gradients (ParamLayout). Under ZeRO-3 those point into gather buffers that exist
// only around the call, which is why they are arguments, not members.
//
// A training micro-batch:
//   for u in 0..num_units()-1:   forward_unit(u, ...)   // last unit: norm + fused head/CE
//   for u in num_units()-1..0:   backward_unit(u, ...)  // gradients ACCUMULATE (+=)
// The loss is the sum of cross-entropy over targets != kIgnoreIndex, multiplied by
// grad_scale for the gradient (grad_scale = 1 / global count of target tokens, so that
// micro-batches and ranks sum to the global mean; times the loss scale in fp16).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shardlm/core/device.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/kv_cache.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

class Backend;
class Communicator;

inline constexpr int32_t kIgnoreIndex = -1;

// One pointer per model unit (index = model unit). Entries for units a call does not
// need may be null.
using UnitPointers = std::span<float* const>;
// Parameters, one per model unit, each fp32 or in the run's compute type.
using ParamPointers = std::span<const ConstTypedPtr>;

struct MicroBatch {
  const int32_t* tokens = nullptr;   // [B, T], ids < vocab_size
  const int32_t* targets = nullptr;  // [B, T], ids < vocab_size or kIgnoreIndex; may be null
                                     // when no loss is wanted (sampling)
  int B = 0;
  int T = 0;
  // Packed sequences (several documents per row), or null: position ids [B, T]
  // (restarting at 0 per document; null: t) and, per token, the row-local index where
  // its document starts (attention never looks before it; null: 0).
  const int32_t* positions = nullptr;
  const int32_t* key_begin = nullptr;
  // Mixture-of-experts models: the weight of this micro-batch's load-balancing loss in
  // the step's loss, for its gradient (the trainer: loss scale / micro-batches of the
  // step over all ranks; the model multiplies by the config's coefficient). 0: none.
  float aux_loss_share = 0.0f;
};

// The groups of ranks a model's own computation talks over, one per model-parallel
// mesh dimension (parallel/mesh_shape.hpp): the ranks that hold this rank's share of the
// same sequences (context), of the same layers (tensor) or of the same layer's experts
// (expert). Null: that dimension has one rank here, and the model computes alone.
// The trainer and `plan` take them from the DeviceMesh; they outlive the model.
struct ModelParallelGroups {
  Communicator* context = nullptr;
  Communicator* tensor = nullptr;
  Communicator* expert = nullptr;
};

// How attention sees whole rows when ModelParallelGroups::context has more than one
// rank (model/context_parallel/context_attention.hpp, docs/parallelism.md).
// hybrid (USP): Ulysses inside consecutive groups of ModelOptions::ulysses_degree ranks,
// ring attention across the groups.
enum class ContextParallelKind { ulysses, ring, hybrid };

struct ModelOptions {
  DType precision = DType::fp32;
  bool activation_checkpointing = false;
  // Where the model's arrays live and its kernels run (backend_for(device)). On a
  // device the micro-batch's arrays are copied into the arena (MicroBatch stays host
  // memory); parameters and gradients handed in must be that device's memory.
  Device device{};
  // Inference only: every forward GEMM runs one row at a time (M = 1), so a row's result
  // does not depend on how many rows share the call. oneDNN sums a row of an M = 1 GEMM
  // in another order than the same row among 16 or more (docs/generation.md), so only
  // this way are KV-cache generation and rerunning the whole context bitwise the same.
  // Off for training (one GEMM per call is much faster).
  bool row_by_row_gemm = false;
  // The backend the model's kernels run on instead of backend_for(device): `plan`'s
  // meta backend standing for `device` (backend/meta). Null: backend_for(device).
  Backend* backend = nullptr;
  ModelParallelGroups parallel_groups{};
  ContextParallelKind context_parallel_kind = ContextParallelKind::ulysses;
  // hybrid: the ranks of each Ulysses group (U divides the context group's P and the heads).
  int ulysses_degree = 1;
  // Megatron's sequence parallelism inside a tensor group of more than one rank: the
  // residual stream, the norms and the residual adds hold 1/T of the micro-batch's
  // tokens; the block's all-reduces become all-gather + reduce-scatter.
  bool sequence_parallel = false;
  // Expert parallelism: how many all_to_all_v carry a sparse layer's rows each way
  // (each a run of held experts; more than the E/P held experts counts as one per held
  // expert). 0: one per held expert on a device, whose communicator moves a held
  // expert's rows while the compute stream runs another's GEMMs; one on the host,
  // whose communication thread shares the cores with the GEMMs it would run beside
  // (docs/parallelism.md, "Expert parallelism"). Results are bitwise the same.
  int expert_exchange_chunks = 0;
};

// What a model allocates (bytes), for `shardlm plan`.
struct ModelMemoryPlan {
  int64_t activations = 0;     // the arena (MemCategory::activations)
  int64_t params_scratch = 0;  // rounding scratch (MemCategory::params)
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual const ModelOptions& options() const = 0;
  // Model units (the granularity of the step loop's hooks).
  virtual int num_units() const = 0;
  // Model units whose parameters model unit u's forward/backward read (a tied LM head
  // also reads the embeddings). The per-unit pointers of every call are indexed by
  // model unit.
  virtual std::vector<int> units_needed_for(int unit) const = 0;
  // Rows of logits the fused LM head computes at a time.
  virtual int logits_chunk_rows() const = 0;

  // Forward of one unit for micro-batch `batch`. For the last unit with batch.targets
  // != null this also computes the loss; with training == true it also computes the
  // head's gradient (grad_scale-weighted) and keeps what backward needs. grads may be
  // empty when !training.
  virtual void forward_unit(int unit, ParamPointers params, UnitPointers grads,
                            const MicroBatch& batch, bool training, float grad_scale) = 0;
  virtual void backward_unit(int unit, ParamPointers params, UnitPointers grads,
                             const MicroBatch& batch) = 0;

  // After forward of the last unit with targets: sum of CE over non-ignored targets
  // (double, unscaled) and the number of such targets.
  virtual double last_loss_sum() const = 0;
  virtual int64_t last_target_count() const = 0;
  // After forward of the last unit: the micro-batch's load-balancing loss (mixture-of-
  // experts models, transformers' load_balancing_loss_func over its B x T tokens and
  // sparse layers, before the coefficient); 0 for dense models.
  virtual double last_aux_loss() const { return 0.0; }
  // Mixture of experts: the last training forward's top-k assignments per expert (its
  // tokens routed to each, summed over the sparse layers; empty for a dense model).
  virtual std::vector<double> last_expert_tokens() const { return {}; }

  // After forward of the last unit with targets == null: logits of position t of each
  // row, [B, vocab_size] (padded columns excluded), for sampling.
  virtual void logits_at(ParamPointers params, int t, float* out) const = 0;

  // Generation with a KV cache (model/kv_cache.hpp). make_kv_cache: an empty cache for
  // up to `capacity` positions (at most the max_seq the model was built for).
  virtual KvCache make_kv_cache(int capacity) const = 0;
  // Forward of one unit over batch.T new tokens of one sequence (batch.B == 1, no
  // targets, positions or key_begin) at positions cache.length() + t: earlier
  // positions' keys and values come from the cache, the new ones are added to it; the
  // last unit advances the cache and leaves logits_at(params, t, out) for new token t.
  // Units in order, as forward_unit; no backward follows.
  virtual void forward_unit_cached(int unit, ParamPointers params, KvCache& cache,
                                   const MicroBatch& batch) = 0;

  // Conveniences over the above for fp32 parameters (tests, tools).
  void forward_unit(int unit, UnitPointers params, UnitPointers grads, const MicroBatch& batch,
                    bool training, float grad_scale);
  void backward_unit(int unit, UnitPointers params, UnitPointers grads, const MicroBatch& batch);
  void logits_at(UnitPointers params, int t, float* out) const;
  void forward_unit_cached(int unit, UnitPointers params, KvCache& cache, const MicroBatch& batch);
  // Fill flat layout unit `unit` (which may hold several model units) with the
  // family's init (init_param_range); deterministic in (seed, parameter name) only.
  void init_unit(int unit, uint64_t seed, float* unit_params) const;
  void init_range(int unit, uint64_t seed, int64_t begin, int64_t end, float* out) const;
  // units_needed_for() of every unit.
  std::vector<std::vector<int>> unit_needs() const;
};

}  // namespace shardlm
