#include "shardlm/parallel/flat_unit.hpp"

#include <algorithm>
#include <string>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

// Buffers on the backend's device (the host's counted by `tracker`, as tests pass).
TrackedBuffer elements(MemCategory category, DType type, int64_t count, MemoryTracker& tracker,
                       Backend& backend) {
  return allocate_on(backend, category, static_cast<size_t>(count) * dtype_bytes(type), tracker);
}

}  // namespace

FlatUnit::FlatUnit(const ParamLayout& layout, int index, const StrategyBufferPlan& plan,
                   int shard_rank, MemoryTracker& tracker, Backend& backend,
                   int partition_size, bool held)
    : layout_(layout.units[static_cast<size_t>(index)]),
      index_(index),
      backend_(backend),
      numel_(held ? layout_.padded_numel : 0),
      slice_numel_(numel_ / (partition_size > 0 ? partition_size : layout.world_size)),
      slice_begin_(shard_rank * slice_numel_),
      shared_(plan.shared_unit[static_cast<size_t>(index)]),
      shard_params_(plan.shard_params),
      shard_grads_(plan.shard_grads),
      whole_unit_owned_(!plan.shard_optimizer),
      no_master_(!layout_.raw && (layout_.trainable ? plan.optimizer_on_host
                                                     : plan.frozen_type != DType::fp32)),
      grads_on_host_(layout_.trainable && plan.optimizer_on_host),
      transient_grads_(plan.transient_grads),
      compute_copy_(plan.compute_copy && !layout_.raw && !no_master_),
      param_type_(layout_.raw                          ? DType::fp32
                  : no_master_ && !layout_.trainable ? plan.frozen_type
                                                       : plan.param_type) {
  SHARDLM_CHECK(!layout_.raw || !layout_.trainable, "internal: raw unit {} is trainable",
                layout_.name);
  // Allocated in this order so that the tracker sees what it always saw (the plan's
  // arithmetic is checked against it byte for byte).
  const MemCategory param_category = trainable() ? MemCategory::params : MemCategory::frozen;
  // Without a master here, stored once, in the type the model reads.
  const DType stored = no_master_ ? param_type_ : DType::fp32;
  if (shard_params_) {
    owned_params_ = elements(param_category, stored, slice_numel_, tracker, backend);
  } else {
    full_params_ = elements(param_category, stored, numel_, tracker, backend);
    if (compute_copy_) {
      compute_params_ = elements(param_category, param_type_, numel_, tracker, backend);
      params_ = TypedPtr(compute_params_.data(), param_type_);
    } else {
      params_ = TypedPtr(full_params_.data(), stored);
    }
  }
  if (shared_ && shard_params_)
    dedicated_params_ = elements(MemCategory::params, param_type_, numel_, tracker, backend);
  if (!trainable()) return;  // no gradients, no optimizer state
  if (!grads_on_host_ && shard_grads_) {
    owned_grads_ = elements(MemCategory::grads, DType::fp32, slice_numel_, tracker, backend);
  } else if (!grads_on_host_) {
    full_grads_ = elements(MemCategory::grads, DType::fp32, numel_, tracker, backend);
    grads_ = full_grads_.as<float>();
  }
  const int64_t optimizer_numel = whole_unit_owned_ ? numel_ : slice_numel_;
  if (!plan.optimizer_on_host) {  // --offload optimizer: AdamW state lives in host memory
    adam_m_ = elements(MemCategory::optimizer, DType::fp32, optimizer_numel, tracker, backend);
    adam_v_ = elements(MemCategory::optimizer, DType::fp32, optimizer_numel, tracker, backend);
  }
  if (shared_ && transient_grads_)
    dedicated_grads_ = elements(MemCategory::grads, DType::fp32, numel_, tracker, backend);
}

const float* FlatUnit::replicated_params() const {
  return shard_params_ || no_master_ ? nullptr : full_params_.as<float>();
}

OwnedSlice FlatUnit::owned() {
  const int64_t begin = whole_unit_owned_ ? 0 : slice_begin_;
  const int64_t end = whole_unit_owned_ ? numel_ : slice_begin_ + slice_numel_;
  if (no_master_) {  // frozen, or trainable with the master (and the rest) on the host
    const TypedPtr stored = shard_params_ ? TypedPtr(owned_params_.data(), param_type_)
                                          : TypedPtr(full_params_.data(), param_type_).at(begin);
    return {begin, end, nullptr, nullptr, nullptr, nullptr, {}, stored};
  }
  float* master = shard_params_ ? owned_params_.as<float>() : full_params_.as<float>() + begin;
  // A frozen unit: its parameters only (loaded, checkpointed, never updated).
  if (!trainable()) return {begin, end, master, nullptr, nullptr, nullptr, {}, {}};
  float* grad = shard_grads_ ? owned_grads_.as<float>() : full_grads_.as<float>() + begin;
  // Only an optimizer that updates the whole unit can keep the compute copy current.
  const TypedPtr compute_copy = whole_unit_owned_ && compute_copy_ ? params_ : TypedPtr();
  return {begin, end, master, grad, adam_m_.as<float>(), adam_v_.as<float>(), compute_copy, {}};
}

// ---- zero3/hybrid: gathering --------------------------------------------------------

void FlatUnit::start_gather(BufferPool& pool, Communicator& shard) {
  void* buffer = nullptr;
  if (shared_) {
    buffer = dedicated_params_.data();
  } else {
    SHARDLM_CHECK(pool.has_free(), "internal: no free gather buffer for unit {} (pool of {})",
                  name(), pool.size());
    gather_slot_ = pool.acquire();
    buffer = pool.data(gather_slot_);
  }
  const TypedPtr gathered(buffer, param_type_);
  const std::string label = "all_gather params unit " + name();
  const float* owned = owned_params_.as<float>();
  if (no_master_) {  // already in the type gathered: the bytes travel
    const size_t bytes = static_cast<size_t>(slice_numel_) * dtype_bytes(param_type_);
    gather_ = shard.all_gather_bytes(owned_params_.data(), buffer, bytes, label);
  } else if (gathered.dtype == DType::fp32) {  // raw units' words travel as they are
    gather_ = shard.all_gather(owned, gathered.f32(), static_cast<size_t>(slice_numel_), label);
  } else {
    // This rank's block is rounded in place in the gather buffer, then gathered.
    const TypedPtr mine = gathered.at(slice_begin_);
    backend_.convert(mine, owned, slice_numel_);
    gather_ = shard.all_gather_bytes(
        mine.data, buffer, static_cast<size_t>(slice_numel_) * dtype_bytes(param_type_), label);
  }
  gather_state_ = GatherState::in_flight;
  params_ = gathered;
  params_moved();
}

void FlatUnit::finish_gather() {
  if (gather_state_ != GatherState::in_flight) return;
  // On a device the kernels that read the gathered unit wait for it on their stream
  // and the host goes on queueing them; where kernels run on the calling thread (CPU,
  // emulated: no stream) this is a host wait. release_gather still waits for the
  // gather on the host before the buffer goes back to the pool.
  if (void* stream = backend_.stream_handle())
    gather_.wait_on_stream(stream);
  else
    gather_.wait();
  gather_state_ = GatherState::ready;
}

void FlatUnit::release_gather(BufferPool& pool) {
  if (gather_state_ == GatherState::none) return;
  gather_.wait();
  if (gather_slot_ != kNoSlot) pool.release(gather_slot_);
  gather_slot_ = kNoSlot;
  gather_state_ = GatherState::none;
  params_ = TypedPtr();
  params_moved();
}

// ---- zero1/zero2: replicated parameters ---------------------------------------------

void FlatUnit::start_param_sync(Communicator& shard) {
  const std::string label = "all_gather params unit " + name();
  if (no_master_) {  // stored as the model reads it: the bytes travel
    const TypedPtr full(full_params_.data(), param_type_);
    param_sync_ = shard.all_gather_bytes(
        full.at(slice_begin_).data, full.data,
        static_cast<size_t>(slice_numel_) * dtype_bytes(param_type_), label);
    return;
  }
  float* full = full_params_.as<float>();
  param_sync_ = shard.all_gather(full + slice_begin_, full, static_cast<size_t>(slice_numel_), label);
}

void FlatUnit::finish_param_sync() { param_sync_.wait(); }

void FlatUnit::refresh_compute_copy() {
  if (!compute_copy_ || !compute_copy_stale_) return;
  backend_.convert(params_, full_params_.as<float>(), numel_);
  compute_copy_stale_ = false;
}

void FlatUnit::broadcast_params(Communicator& shard, int root) {
  shard.broadcast(full_params_.data(), full_params_.bytes(), root,
                  "broadcast initial params unit " + name())
      .wait();
}

// ---- zero2/zero3: transient gradients -----------------------------------------------

void FlatUnit::acquire_grads(BufferPool& pool) {
  float* buffer = nullptr;
  if (shared_) {
    buffer = dedicated_grads_.as<float>();
  } else {
    SHARDLM_CHECK(pool.has_free(), "internal: no free gradient buffer for unit {}", name());
    grad_slot_ = pool.acquire();
    buffer = static_cast<float*>(pool.data(grad_slot_));
  }
  backend_.fill_zero(buffer, static_cast<size_t>(numel_) * sizeof(float));
  grads_ = buffer;
  grads_moved();
}

void FlatUnit::start_reduce(Communicator& shard, WireType wire) {
  reduce_ = shard.reduce_scatter(grads_, grads_ + slice_begin_, static_cast<size_t>(slice_numel_),
                                 ReduceOp::sum, "reduce_scatter grads unit " + name(), wire);
  // ddp's optimizer (on the host) updates the whole unit: every rank needs every
  // reduced slice, as ddp's buckets all-gather them (the same collectives, so the same
  // values).
  if (grads_on_host_ && whole_unit_owned_)
    gather_reduced_ = shard.all_gather(grads_ + slice_begin_, grads_,
                                       static_cast<size_t>(slice_numel_),
                                       "all_gather grads unit " + name());
  reduce_pending_ = true;
}

void FlatUnit::finish_reduce(Communicator* replica, BufferPool& pool) {
  reduce_.wait();
  gather_reduced_.wait();
  reduce_pending_ = false;
  float* reduced = grads_ + slice_begin_;
  const int64_t n = slice_numel_;
  if (replica != nullptr)
    replica->all_reduce(reduced, static_cast<size_t>(n), ReduceOp::sum,
                        "all_reduce grads across replicas unit " + name())
        .wait();
  // The owned gradient accumulates over micro-batches (on the host, with the optimizer).
  if (grads_on_host_) {
    SHARDLM_CHECK(host_gradients_ != nullptr, "internal: unit {} has no host gradients", name());
    host_gradients_->accumulate(index_, whole_unit_owned_ ? grads_ : reduced,
                                whole_unit_owned_ ? numel_ : n);
  } else {
    backend_.accumulate(owned_grads_.as<float>(), reduced, n);
  }
  if (grad_slot_ != kNoSlot) pool.release(grad_slot_);
  grad_slot_ = kNoSlot;
  grads_ = nullptr;
  grads_moved();
}

// ---- ddp/zero1: full gradients --------------------------------------------------------

Work FlatUnit::start_reduce_in_place(Communicator& shard, WireType wire) {
  float* grads = full_grads_.as<float>();
  return shard.reduce_scatter(grads, grads + slice_begin_, static_cast<size_t>(slice_numel_),
                              ReduceOp::sum, "reduce_scatter grads unit " + name(), wire);
}

Work FlatUnit::start_gather_reduced(Communicator& shard) {
  float* grads = full_grads_.as<float>();
  return shard.all_gather(grads + slice_begin_, grads, static_cast<size_t>(slice_numel_),
                          "all_gather grads unit " + name());
}

// ---- every strategy -------------------------------------------------------------------

void FlatUnit::zero_reduced_grads() {
  TrackedBuffer& reduced = shard_grads_ ? owned_grads_ : full_grads_;
  backend_.fill_zero(reduced.data(), reduced.bytes());  // frozen units hold none
}

float* FlatUnit::reduced_grad_slice() {
  if (shard_grads_) return owned_grads_.as<float>();
  return full_grads_.as<float>() + slice_begin_;
}

double FlatUnit::reduced_grad_sum_of_squares() {
  return reduced_grad_sum_of_squares(slice_begin_, slice_begin_ + slice_numel_);
}

double FlatUnit::reduced_grad_sum_of_squares(int64_t begin, int64_t end) {
  SHARDLM_ASSERT(trainable());
  int64_t lo = std::max(begin, slice_begin_), hi = std::min(end, slice_begin_ + slice_numel_);
  if (lo > hi) lo = hi = slice_begin_;  // outside the slice: nothing (the kernel runs on 0 elements)
  if (grads_on_host_) {
    SHARDLM_CHECK(host_gradients_ != nullptr, "internal: unit {} has no host gradients", name());
    return host_gradients_->sum_of_squares(index_, (whole_unit_owned_ ? slice_begin_ : 0) + (lo - slice_begin_),
                                           hi - lo);
  }
  return backend_.sum_of_squares(reduced_grad_slice() + (lo - slice_begin_), hi - lo);
}

}  // namespace shardlm
