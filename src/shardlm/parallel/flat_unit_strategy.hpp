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
// --offload optimizer (a device run, StrategyOptions::optimizer_on_host): every
// strategy keeps on the device only the parameters in the compute type (the column
// above, without fp32 master or compute copy) and 2 transient full-unit gradient
// buffers; the reduced owned slice of each unit (ddp: the whole unit, all-gathered) is
// handed to HostGradients, which accumulates it in fp32 in host memory, where AdamW
// runs (parallel/host_owned_state.hpp). Reduced unit by unit as backward completes it
// and every micro-batch, as zero2 is: the same collectives on the same values, so an
// offloaded run equals a run without offload of zero2 (and, without accumulation, of
// every strategy) bitwise.
//
// Frozen units (a LoRA run's base) have no gradient or optimizer state. In a bf16 or
// fp16 run their parameters are stored once, in the compute type (rounded to nearest
// even on load, the value a compute copy of an fp32 master would hold): whole units
// for ddp/zero1/zero2, owned slices for zero3/hybrid, gathered as they are stored.
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
//
// The state of each flat unit lives in a FlatUnit (flat_unit.hpp), the pooled
// buffers in BufferPools, ddp/zero1's buckets in GradBuckets; this class is the
// schedule: which unit gathers, reduces and releases when.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/parallel/buffer_pool.hpp"
#include "shardlm/parallel/flat_unit.hpp"
#include "shardlm/parallel/grad_bucket.hpp"
#include "shardlm/parallel/host_gradients.hpp"
#include "shardlm/parallel/mesh.hpp"
#include "shardlm/parallel/owned_state.hpp"
#include "shardlm/parallel/strategy.hpp"
#include "shardlm/parallel/strategy_buffer_plan.hpp"
#include "shardlm/parallel/strategy_options.hpp"

namespace shardlm {

class FlatUnitStrategy : public Strategy, public OwnedState {
 public:
  // Not copied or moved: its flat units report buffer moves into lists it owns.
  FlatUnitStrategy(const FlatUnitStrategy&) = delete;
  FlatUnitStrategy& operator=(const FlatUnitStrategy&) = delete;
  // layout is built for partition_size(options, world size) ranks; unit_needs as below.
  static StrategyBufferPlan plan_buffers(const ParamLayout& layout,
                                         const std::vector<std::vector<int>>& unit_needs,
                                         const StrategyOptions& options);
  // ddp/zero1 gradient buckets: flat units per bucket, in launch (backward) order.
  static std::vector<std::vector<int>> plan_buckets(const ParamLayout& layout, double bucket_mb);

  // The static schedule of a training micro-batch (forward 0..M-1, backward M-1..0)
  // and the release rule zero3/hybrid follow.
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

  // The mesh groups the strategy talks over: the partition (partition_dims(): shard x
  // context, with an expert dimension shard x context x expert, the dense units'), the
  // experts' partition (expert_partition_dims(shape)) under expert parallelism, and
  // replicate when there are replicas (hybrid). A DeviceMesh handed to the strategy must
  // have them.
  static std::vector<MeshDims> mesh_groups(const MeshShape& shape);
  // Expert parallelism over `expert_parallel` ranks: the place in the expert group
  // (MeshShape::expert_rank) that holds flat unit `unit` (experts / E consecutive
  // experts each), or -1 for a dense unit,
  // which every rank holds.
  static int expert_holder(const UnitLayout& unit, int expert_parallel);

  // layout must be built for the mesh's partition size (partition_size(options, world
  // size): shard x context) and the mesh must be strategy_mesh(options, world size). unit_needs[m]
  // lists the model units whose parameters model unit m reads
  // (Model::unit_needs()). Hooks take model units; buffers, collectives and
  // owned slices are per flat layout unit (one or more model units). Buffers are
  // counted by `tracker` and live where `backend` computes (the host, or a device
  // whose collectives the mesh's communicators run); the strategy's kernels
  // (rounding, zeroing, the norm) run on `backend`. The mesh must outlive the strategy.
  FlatUnitStrategy(const ParamLayout& layout, std::vector<std::vector<int>> unit_needs,
                   DeviceMesh& mesh, const StrategyOptions& options,
                   MemoryTracker& tracker = MemoryTracker::global(),
                   Backend& backend = cpu_backend());
  // The same on the obvious mesh over `world` (strategy_mesh), which the strategy owns.
  FlatUnitStrategy(const ParamLayout& layout, std::vector<std::vector<int>> unit_needs,
                   Communicator& world, const StrategyOptions& options,
                   MemoryTracker& tracker = MemoryTracker::global(),
                   Backend& backend = cpu_backend());
  ~FlatUnitStrategy() override;

  std::string name() const override { return to_string(options_.kind); }
  int world_size() const override { return mesh_.world().size(); }
  int rank() const override { return mesh_.rank(); }
  const MeshShape& mesh() const { return mesh_.shape(); }
  ParamPointers params() override;
  UnitPointers grads() override;
  // The full fp32 buffer of a flat unit when parameters are replicated (ddp, zero1,
  // zero2), else nullptr: what --check-replicas compares.
  const float* replicated_params(int unit) const;
  OwnedSlice owned(int unit) override;
  // --offload optimizer: where the reduced gradients go (the HostOwnedState holding the
  // optimizer), before the first step.
  void accumulate_gradients_on(HostGradients& host);

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
  bool writes_unit(int unit) const override;
  // Whether this rank holds flat unit `unit` (all but the experts held elsewhere).
  bool holds(int unit) const { return partition_[static_cast<size_t>(unit)] != nullptr; }

  // Read and reset the counters of the mesh's groups split from the world (hybrid's
  // shard and replica groups; empty otherwise), which the world's counters do not see.
  CommCounters take_group_counters();

  // Units whose parameters are currently gathered (zero3/hybrid), for leak checks.
  int gathered_units() const;
  // Gradient reductions still queued or running.
  int pending_reductions() const;
  // DDP/zero1 bucket assignment (units per bucket, in launch order), for tests.
  std::vector<std::vector<int>> buckets() const;

 private:
  FlatUnitStrategy(const ParamLayout& layout, std::vector<std::vector<int>> unit_needs,
                   DeviceMesh* mesh, std::unique_ptr<DeviceMesh> owned_mesh,
                   const StrategyOptions& options, MemoryTracker& tracker, Backend& backend);
  static bool step_needs(const std::vector<Step>& schedule, const FlatNeeds& needs, size_t step,
                         int unit);
  FlatUnit& unit(int index) { return units_[static_cast<size_t>(index)]; }
  // The ranks flat unit `index` is partitioned over (held here).
  Communicator& partition(int index) { return *partition_[static_cast<size_t>(index)]; }

  // zero3/hybrid: gathered parameters, per the schedule.
  void ensure_gathered(int unit);
  void prefetch_after(size_t cursor);
  void release_after(size_t cursor);
  size_t schedule_index(bool backward, int model_unit) const;
  // Replicated params: waits for the unit's pending all-gather, then (bf16) rounds its
  // fp32 parameters into the compute copy if they changed since (after_step,
  // after_load).
  void refresh_replicated_params(int unit);
  // zero1/zero2: all-gather the owners' parameter slices (after a step, or a load, which
  // also covers the frozen units); every strategy: mark compute copies stale.
  void gather_updated_params(bool frozen_too);
  // zero2/zero3: a transient full-unit gradient buffer for the unit, once its previous
  // reduction (and, for a pool buffer, the oldest ones) finished.
  void acquire_grads(int unit);
  void consume_oldest_reduce();

  const ParamLayout& layout_;
  std::vector<std::vector<int>> unit_needs_;  // per model unit: flat units it reads
  std::vector<int> unit_of_;                  // model unit -> flat unit
  std::vector<int> first_model_unit_;         // flat unit -> its first model unit
  std::unique_ptr<DeviceMesh> owned_mesh_;  // the convenience constructor's
  DeviceMesh& mesh_;
  // The dense units' partition: the mesh's partition_dims() group (the world unless
  // hybrid).
  Communicator* shard_;
  // Per flat unit: its partition (shard_, or the experts' expert_partition_dims() group),
  // null for an expert held on another place in the expert group.
  std::vector<Communicator*> partition_;
  Communicator* replica_;  // the replicate group when it has more than one rank, else null
  // The tensor group (tensor parallelism, more than one rank), else null: its ranks
  // hold other pieces of the split tensors, so the gradient norm sums their pieces.
  Communicator* tensor_ = nullptr;
  const StrategyOptions options_;
  const int num_units_;
  const int num_model_units_;
  const bool shard_params_;
  // Gradients in pooled (or a shared unit's dedicated) buffers, reduce-scattered unit
  // by unit as backward completes them: zero2/zero3/hybrid, and every strategy with the
  // optimizer on the host; else ddp/zero1's full buffers, reduced in buckets.
  const bool transient_grads_;
  HostGradients* host_gradients_ = nullptr;
  const WireType reduce_wire_;

  std::vector<FlatUnit> units_;                  // per flat unit
  std::vector<ConstTypedPtr> model_param_ptrs_;  // per model unit (what the model reads)
  std::vector<float*> model_grad_ptrs_;
  // params()/grads() refresh only the model units of the flat units that reported a
  // move since the last call (FlatUnit::report_moves_to): rebuilding every pointer on
  // every call is quadratic in the units (an MoE model has one unit per expert), and
  // they run once per unit. The units hold pointers to these lists: the strategy is
  // neither copied nor moved.
  std::vector<std::vector<int>> model_units_of_;  // per flat unit
  std::vector<int> params_moved_, grads_moved_;   // flat units

  // zero3/hybrid parameter gathering
  BufferPool gather_buffers_;
  std::vector<Step> train_schedule_, eval_schedule_;
  const std::vector<Step>* schedule_ = &train_schedule_;
  bool training_ = false;

  // zero2/zero3 gradient reduction
  BufferPool grad_buffers_;
  std::deque<int> pending_reduces_;  // units whose reduce-scatter is in flight, oldest first

  // ddp/zero1 buckets, in launch order
  std::vector<GradBucket> buckets_;
  int num_micro_batches_ = 1;
};

}  // namespace shardlm
