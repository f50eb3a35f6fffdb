// FlatUnitStrategy: DDP, ZeRO-1/2/3 and hybrid shard over flat units, as hooks of
// the step loop. What differs between them is only what is sharded:
//
//   strategy | params (fp32)        | grads                      | AdamW m, v
//   ddp      | full unit            | full unit                  | full unit
//   zero1    | full unit            | full unit                  | owned slice
//   zero2    | full unit            | owned slice (+2 transient) | owned slice
//   zero3    | owned slice (+gather)| owned slice (+2 transient) | owned slice
//   hybrid   | zero3 in shard groups; owned slices all-reduced across replica groups
//
// Raw units (a QLoRA run's NF4 base layers) are bytes in fp32 words: every strategy
// hands them to the model as stored, zero3 gathers them as words, none rounds them.
// zero3/hybrid gather parameters in StrategyOptions::param_dtype (the compute type:
// bf16 gather buffers are half of fp32's). In a bf16 run ddp/zero1/zero2 also keep a
// bf16 copy of their fp32 parameters, rounded once per step before the first use (the
// model would otherwise round every unit at every forward and backward); in fp16 the
// model rounds fp32 parameters itself. Rounding is the same function of the same fp32
// master everywhere, so every strategy computes the same.
// Gradients are reduce-scattered in StrategyOptions::reduce_dtype on the wire (fp32
// or bf16); DDP's all-gather of the reduced slices and hybrid's all-reduce across
// replica groups stay fp32, so replicas never diverge.
//
// Every strategy reduces gradients with the same per-unit reduce-scatter over the
// same partition (DDP's all-reduce is reduce-scatter + all-gather of each unit), the
// global norm is summed over the same slices, and AdamW is element-wise, so at a
// fixed world size all strategies give bitwise-identical weights (without gradient
// accumulation; with it, zero2/zero3 reduce every micro-batch).
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/parallel/strategy.hpp"
#include "shardlm/parallel/strategy_options.hpp"

namespace shardlm {

// What a strategy allocates per rank at start-up (it allocates nothing later): the
// one arithmetic the constructor follows and `shardlm plan` reports.
struct StrategyBufferPlan {
  bool shard_params = false, shard_grads = false, shard_optimizer = false;
  DType param_type = DType::fp32;   // of what the model reads (gathered or copied)
  bool compute_copy = false;        // replicated params also kept in param_type (bf16)
  std::vector<bool> shared_unit;    // flat units another model unit reads (tied head)
  int64_t largest_private_unit = 0; // elements
  int64_t gather_buffer_bytes = 0;  // zero3/hybrid: one gather buffer (largest private unit)
  int64_t largest_trainable_private_unit = 0;  // what a transient gradient buffer holds
  int param_pool = 0;               // zero3/hybrid gather buffers of that size
  int grad_pool = 0;                // zero2/zero3 transient gradient buffers of that size
  int64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  int64_t frozen_bytes = 0;  // frozen units' parameters (masters and compute copies)
  // Raw units (quantized, UnitLayout::raw) are handed out, gathered and kept as stored:
  // fp32 words, no compute copy.
  // zero3/hybrid: all-gathers of each flat unit per training micro-batch (a unit that
  // consecutive steps need stays gathered between them).
  std::vector<int> gathers_per_micro_batch;
};

class FlatUnitStrategy : public Strategy {
 public:
  // layout is built for partition_size(options, world size) ranks; unit_needs as below.
  static StrategyBufferPlan plan_buffers(const ParamLayout& layout,
                                         const std::vector<std::vector<int>>& unit_needs,
                                         const StrategyOptions& options);
  // ddp/zero1 gradient buckets: flat units per bucket, in launch (backward) order.
  static std::vector<std::vector<int>> plan_buckets(const ParamLayout& layout, double bucket_mb);

  // The static schedule of a training micro-batch (forward 0..M-1, backward M-1..0)
  // and the release rule zero3/hybrid follow, for `plan`'s step-time model.
  struct Step {
    bool backward;
    int model_unit;
  };
  using FlatNeeds = std::vector<std::vector<int>>;  // per model unit: flat units it reads
  static std::vector<Step> training_schedule(int num_model_units);
  static FlatNeeds flat_needs(const ParamLayout& layout,
                              const std::vector<std::vector<int>>& unit_needs);
  // After schedule step `cursor`, whether flat unit v (which that step read) stays
  // gathered: the release rule, shared by release_after and plan_buffers.
  static bool keeps_gathered(const std::vector<Step>& schedule, const FlatNeeds& needs,
                             size_t cursor, int v, bool keep_forward_units);

  // layout must be built for partition_size(options, world.size()) ranks. unit_needs[m]
  // lists the model units whose parameters model unit m reads
  // (Gpt2Model::units_needed_for). Hooks take model units; buffers, collectives and
  // owned slices are per flat layout unit (one or more model units).
  FlatUnitStrategy(const ParamLayout& layout, std::vector<std::vector<int>> unit_needs,
                   Communicator& world, const StrategyOptions& options,
                   MemoryTracker& tracker = MemoryTracker::global());
  ~FlatUnitStrategy() override;

  std::string name() const override { return to_string(options_.kind); }
  int world_size() const override { return world_.size(); }
  int rank() const override { return world_.rank(); }
  ParamPointers params() override;
  UnitPointers grads() override;
  // The full fp32 buffer of a flat unit when parameters are replicated (ddp, zero1,
  // zero2), else nullptr: what --check-replicas compares.
  const float* replicated_params(int unit) const;
  OwnedSlice owned(int unit) override;

  void begin_step(int num_micro_batches) override;
  void before_forward(int model_unit, bool training) override;
  void after_forward(int model_unit) override;
  void before_backward(int model_unit) override;
  void after_backward(int model_unit, int micro_batch) override;
  void finish_gradients() override;
  double global_grad_norm_squared() override;
  void after_step() override;
  void after_load() override;
  void synchronize() override;
  bool writes_checkpoint() const override;

  // Read and reset the counters of the strategy's own communicators (hybrid's shard
  // and replica groups; empty otherwise), which the world's counters do not see.
  CommCounters take_group_counters();

  // Units whose parameters are currently gathered (zero3/hybrid), for leak checks.
  int gathered_units() const;
  // Gradient reductions still queued or running.
  int pending_reductions() const;
  // DDP/zero1 bucket assignment (units per bucket, in launch order), for tests.
  const std::vector<std::vector<int>>& buckets() const { return buckets_; }

 private:
  static bool step_needs(const std::vector<Step>& schedule, const FlatNeeds& needs, size_t step,
                         int unit);
  struct PendingReduce {
    int unit;
    Work work;
  };
  enum class GatherState { none, in_flight, ready };

  // zero3: gathered parameter buffers.
  void ensure_gathered(int unit);
  void start_gather(int unit);
  void release_params(int unit);
  void prefetch_after(size_t cursor);
  void release_after(size_t cursor);
  size_t schedule_index(bool backward, int model_unit) const;
  // Replicated params in a bf16 run: waits for the unit's pending all-gather, then
  // rounds its fp32 parameters into the bf16 copy if they changed since (after_step,
  // after_load).
  void refresh_compute_params(int unit);
  // zero1/zero2: all-gather the owners' parameter slices (after a step, or a load, which
  // also covers the frozen units); every strategy: mark compute copies stale.
  void gather_updated_params(bool frozen_too);
  // zero2/zero3: transient full-unit gradient buffers.
  void acquire_grads(int unit);
  void consume_oldest_reduce();
  void launch_bucket(size_t bucket);
  float* owned_grad_slice(int unit);

  const ParamLayout& layout_;
  std::vector<std::vector<int>> unit_needs_;  // per model unit: flat units it reads
  std::vector<int> unit_of_;                  // model unit -> flat unit
  std::vector<int> first_model_unit_;         // flat unit -> its first model unit
  Communicator& world_;
  std::unique_ptr<Communicator> shard_group_, replica_group_;
  Communicator* shard_;    // partition communicator (world unless hybrid)
  Communicator* replica_;  // hybrid only: same shard index across groups
  const StrategyOptions options_;
  MemoryTracker& tracker_;
  const int num_units_;
  const int num_model_units_;
  int shard_rank_, shard_size_;
  const bool shard_params_, shard_grads_, shard_optimizer_;
  std::vector<bool> shared_unit_;  // read by another unit (kept in dedicated buffers)
  std::vector<bool> trainable_;    // per flat unit: frozen units have no grads/optimizer
  std::vector<bool> raw_;          // per flat unit: stored words (quantized), never converted
  DType unit_param_type(size_t u) const { return raw_[u] ? DType::fp32 : param_type_; }

  std::vector<TrackedBuffer> full_params_, owned_params_, full_grads_, owned_grads_;
  std::vector<TrackedBuffer> adam_m_, adam_v_;
  const DType param_type_;                   // of what params() hands out
  const WireType reduce_wire_;
  std::vector<TypedPtr> param_ptrs_;    // per flat unit
  std::vector<float*> grad_ptrs_;            // per flat unit
  std::vector<ConstTypedPtr> model_param_ptrs_;  // per model unit (what the model reads)
  std::vector<float*> model_grad_ptrs_;

  // zero3 parameter gathering
  std::vector<TrackedBuffer> param_pool_;
  std::vector<int> free_param_buffers_;
  std::vector<TrackedBuffer> dedicated_params_;  // per unit; only shared units
  std::vector<int> param_buffer_of_;             // pool index, -1 none, -2 dedicated
  std::vector<GatherState> gather_state_;
  std::vector<Work> gather_work_;
  std::vector<Step> train_schedule_, eval_schedule_;
  const std::vector<Step>* schedule_ = &train_schedule_;
  bool training_ = false;

  // zero2/zero3 gradient reduction
  std::vector<TrackedBuffer> grad_pool_;
  std::vector<int> free_grad_buffers_;
  std::vector<TrackedBuffer> dedicated_grads_;
  std::vector<int> grad_buffer_of_;
  std::deque<PendingReduce> pending_reduces_;

  // ddp/zero1 buckets
  std::vector<std::vector<int>> buckets_;
  std::vector<int> bucket_of_unit_;
  std::vector<Work> bucket_works_;
  int num_micro_batches_ = 1;

  // zero1/zero2: all-gather of updated params, waited before next use
  std::vector<Work> param_sync_;
  // ddp/zero1/zero2 in bf16: the model reads these copies of full_params_
  bool compute_copy_ = false;
  std::vector<TrackedBuffer> compute_params_;
  std::vector<bool> compute_params_stale_;
};

}  // namespace shardlm
