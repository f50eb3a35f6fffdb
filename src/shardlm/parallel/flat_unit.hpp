// FlatUnit: one flat layout unit's state on this rank under a FlatUnitStrategy: its
// buffers (fp32 master, gradients, AdamW moments, compute copy, the dedicated full
// buffers of a shared unit), what the model reads and accumulates into right now,
// and the collectives in flight on it, each as a start_*/finish_* pair. One object
// per unit, as PyTorch FSDP2's FSDPParamGroup, so that a device backend can attach
// its streams and events to the unit they order. The strategy decides which unit
// starts and finishes what, and when (the schedule); a unit decides how (which
// buffer, which collective, which kernel).
//
// Which buffers a unit keeps follows StrategyBufferPlan (the table in
// flat_unit_strategy.hpp); the rank owns elements [slice_begin, slice_begin +
// slice_numel) of the unit, its slice of the partition. A frozen unit of a bf16/fp16
// run keeps its parameters once, in the compute type (no fp32 master, no compute
// copy): owned() hands them out as OwnedSlice::stored. With the optimizer on the host
// (--offload optimizer) a trainable unit does the same in the run's compute type, and
// keeps no gradient of its own: the model writes into a transient full buffer, which
// is reduced (ddp: and all-gathered, the rank owning the whole unit) and handed to the
// HostGradients, where the step's gradient accumulates.
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/buffer_pool.hpp"
#include "shardlm/parallel/host_gradients.hpp"
#include "shardlm/parallel/owned_state.hpp"
#include "shardlm/parallel/strategy_buffer_plan.hpp"

namespace shardlm {

class FlatUnit {
 public:
  // Allocates the unit's own buffers as `plan` says (unit `index` of the layout the
  // plan was made for), counted by `tracker`; kernels run on `backend`. It is
  // partitioned over `partition_size` ranks (0: the layout's world size; an expert's
  // partition under expert parallelism is smaller), this rank being `shard_rank`; a
  // unit not `held` here (an expert held elsewhere) has no buffers and owns nothing.
  FlatUnit(const ParamLayout& layout, int index, const StrategyBufferPlan& plan,
           int shard_rank, MemoryTracker& tracker, Backend& backend, int partition_size = 0,
           bool held = true);

  const std::string& name() const { return layout_.name; }
  bool trainable() const { return layout_.trainable; }
  // Another model unit reads it (a tied head): it is gathered and accumulated in
  // dedicated full buffers rather than pool buffers.
  bool shared() const { return shared_; }

  // What the model reads (null while not gathered) and accumulates into (null while
  // no gradient buffer is held or the unit is frozen).
  TypedPtr params() const { return params_; }
  float* grads() const { return grads_; }
  // The full fp32 master when parameters are replicated (ddp, zero1, zero2), else null
  // (also for a frozen unit stored in the compute type).
  const float* replicated_params() const;
  // What the optimizer and checkpoints see (Strategy::owned): the owned slice, or the
  // whole unit where the optimizer state is replicated (ddp).
  OwnedSlice owned();

  // --- zero3/hybrid: gathering the owned parameter slices ------------------------------
  // Takes a gather buffer (the dedicated one for a shared unit, else one of `pool`),
  // rounds this rank's slice into it in the model's type and all-gathers.
  void start_gather(BufferPool& pool, Communicator& shard);
  // Waits for the gather started last, if still in flight.
  void finish_gather();
  // Waits for any gather in flight and gives its buffer back; params() becomes null.
  void release_gather(BufferPool& pool);
  bool gathered() const { return gather_state_ != GatherState::none; }

  // --- zero1/zero2: replicated parameters after the owners updated their slices --------
  // All-gathers the owners' updated slices into the full master in place.
  void start_param_sync(Communicator& shard);
  void finish_param_sync();
  // The compute copy no longer matches the master (refresh_compute_copy rebuilds it).
  void mark_compute_copy_stale() { compute_copy_stale_ = true; }
  // Rounds the master into the compute copy if it is stale (bf16 runs of the replicated
  // strategies: once per step instead of by the model at every use).
  void refresh_compute_copy();
  // ddp's sync_module_states: the replica of `root` overwrites every other replica.
  void broadcast_params(Communicator& shard, int root);

  // --- zero2/zero3: transient full gradient and its reduce-scatter ---------------------
  // Takes a zeroed full gradient buffer (the dedicated one for a shared unit, else one
  // of `pool`, which must have a free one).
  void acquire_grads(BufferPool& pool);
  // Reduce-scatters the full gradient in the wire type into its owned slice (with the
  // optimizer on the host and the whole unit owned, ddp, then all-gathers the reduced
  // slices back into the full buffer).
  void start_reduce(Communicator& shard, WireType wire);
  bool reduce_pending() const { return reduce_pending_; }
  // Waits for the reduce-scatter, sums the slice across replica groups (hybrid:
  // `replica` non-null), adds it to the owned gradient (which accumulates over
  // micro-batches; with the optimizer on the host, HostGradients::accumulate) and gives
  // the full buffer back; grads() becomes null.
  void finish_reduce(Communicator* replica, BufferPool& pool);
  // --offload optimizer: where finish_reduce sends the reduced gradient and the norm is
  // taken (set before the first step).
  void send_reduced_gradients_to(HostGradients* host) { host_gradients_ = host; }

  // --- ddp/zero1: full gradients reduced in buckets (GradBucket) ----------------------
  // Reduce-scatters the full gradient in place: the owned slice receives the sum.
  Work start_reduce_in_place(Communicator& shard, WireType wire);
  // ddp: all-gathers the summed slices back into the full gradient.
  Work start_gather_reduced(Communicator& shard);

  // --- every strategy -----------------------------------------------------------------
  // Where this unit appends its index when params() or grads() point somewhere new
  // (gathered, released, a gradient buffer taken or given back): FlatUnitStrategy keeps
  // the model's pointers and refreshes only the units listed (null: nobody listens).
  void report_moves_to(std::vector<int>* params_moved, std::vector<int>* grads_moved) {
    params_moved_ = params_moved;
    grads_moved_ = grads_moved;
  }
  // Zeroes what accumulates the reduced gradient over a step (begin_step).
  void zero_reduced_grads();
  // This rank's part of the squared global norm: its reduced slice (0 when frozen).
  double reduced_grad_sum_of_squares();
  // The part of it within the unit's elements [begin, end) (a tensor-parallel piece).
  double reduced_grad_sum_of_squares(int64_t begin, int64_t end);

 private:
  enum class GatherState { none, in_flight, ready };
  static constexpr int kNoSlot = -1;

  float* reduced_grad_slice();

  const UnitLayout& layout_;
  const int index_;  // in the layout
  Backend& backend_;
  const int64_t numel_;         // padded: the full unit
  const int64_t slice_numel_;   // this rank's slice
  const int64_t slice_begin_;
  const bool shared_;
  const bool shard_params_, shard_grads_;
  const bool whole_unit_owned_;  // ddp: the optimizer updates the whole unit
  // No fp32 master here: stored once in param_type_ (a frozen unit, not raw, of a
  // bf16/fp16 run; a trainable unit with the optimizer on the host).
  const bool no_master_;
  // The optimizer on the host, the unit trainable: no gradient buffer of its own.
  const bool grads_on_host_;
  const bool transient_grads_;   // pooled/dedicated full gradient buffers
  const bool compute_copy_;      // replicated params also kept in param_type_
  const DType param_type_;       // what the model reads; raw units: stored fp32 words

  // Storage, allocated once; a buffer the plan does not keep stays empty.
  TrackedBuffer full_params_, owned_params_, compute_params_, dedicated_params_;
  TrackedBuffer full_grads_, owned_grads_, dedicated_grads_;
  TrackedBuffer adam_m_, adam_v_;

  TypedPtr params_;
  float* grads_ = nullptr;
  std::vector<int>* params_moved_ = nullptr;
  std::vector<int>* grads_moved_ = nullptr;
  void params_moved() { if (params_moved_ != nullptr) params_moved_->push_back(index_); }
  void grads_moved() { if (grads_moved_ != nullptr) grads_moved_->push_back(index_); }

  GatherState gather_state_ = GatherState::none;
  Work gather_;
  int gather_slot_ = kNoSlot;  // pool slot while gathered into the pool

  Work param_sync_;
  bool compute_copy_stale_ = true;

  Work reduce_, gather_reduced_;  // gather_reduced_: ddp with the optimizer on the host
  bool reduce_pending_ = false;
  HostGradients* host_gradients_ = nullptr;
  int grad_slot_ = kNoSlot;  // pool slot while the full gradient lives in the pool
};

}  // namespace shardlm
