#include "shardlm/parallel/flat_unit_strategy.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

// The type params() hands the model: zero3/hybrid gather in the compute type; the
// replicated strategies keep a bf16 copy of their fp32 parameters in a bf16 run
// (rounded once per step instead of by the model at every use), and hand fp16 runs
// fp32, which the model rounds to fp16 values itself (there is no fp16 GEMM). With the
// optimizer on the host, the device stores the compute type only (the host rounds).
DType model_param_type(const StrategyOptions& options) {
  if (shards_parameters(options.kind) || options.param_dtype == DType::bf16 ||
      options.optimizer_on_host)
    return options.param_dtype;
  return DType::fp32;
}

}  // namespace

StrategyBufferPlan FlatUnitStrategy::plan_buffers(const ParamLayout& layout,
                                                  const std::vector<std::vector<int>>& unit_needs,
                                                  const StrategyOptions& options) {
  StrategyBufferPlan plan;
  plan.shard_params = shards_parameters(options.kind);
  plan.shard_grads = options.kind == StrategyKind::zero2 || plan.shard_params;
  plan.shard_optimizer = options.kind != StrategyKind::ddp;
  plan.optimizer_on_host = options.optimizer_on_host;
  plan.transient_grads = plan.shard_grads || plan.optimizer_on_host;
  plan.param_type = model_param_type(options);
  plan.compute_copy =
      !plan.shard_params && plan.param_type != DType::fp32 && !plan.optimizer_on_host;
  plan.frozen_type = options.param_dtype;
  const size_t U = static_cast<size_t>(layout.num_units());
  plan.shared_unit.assign(U, false);
  for (size_t m = 0; m < unit_needs.size(); ++m)
    for (int v : unit_needs[m]) {
      const int flat = layout.model_units[static_cast<size_t>(v)].unit;
      if (flat != layout.model_units[m].unit) plan.shared_unit[static_cast<size_t>(flat)] = true;
    }
  int private_units = 0;
  const int64_t pb = static_cast<int64_t>(dtype_bytes(plan.param_type));
  int private_trainable_units = 0;
  int64_t largest_owned = 0;  // optimizer on the host: the staging slice's elements
  // Expert parallelism: the rank holds the experts of its expert coordinate (0 here:
  // every coordinate holds as many, of the same sizes), partitioned over shard.
  const int E = options.expert_parallel;
  for (size_t u = 0; u < U; ++u) {
    const int holder = expert_holder(layout.units[u], E);
    if (holder > 0) continue;
    const int64_t P = layout.units[u].padded_numel;
    const int64_t S = P / (holder < 0 ? layout.world_size : layout.world_size / E);
    const bool trains = layout.units[u].trainable;
    const bool raw = layout.units[u].raw;
    const int64_t ub = raw ? 4 : pb;  // bytes per element as the model reads it
    const int64_t owned = plan.shard_optimizer ? S : P;  // OwnedSlice's elements
    if (!trains) {
      // A frozen unit keeps its parameters only (MemCategory::frozen), stored once:
      // raw words, or values in frozen_type.
      const int64_t fb = raw ? 4 : static_cast<int64_t>(dtype_bytes(plan.frozen_type));
      plan.frozen_bytes += fb * (plan.shard_params ? S : P);
      plan.host_frozen_bytes += fb * owned;
    } else if (plan.optimizer_on_host) {
      // Stored once, in the type the model reads; everything else is the host's.
      plan.params_bytes += pb * (plan.shard_params ? S : P);
      plan.host_params_bytes += 4 * owned;
      plan.host_optimizer_bytes += 8 * owned;
      plan.host_grads_bytes += 4 * owned;
      largest_owned = std::max(largest_owned, owned);
    } else {
      plan.params_bytes += 4 * (plan.shard_params ? S : P);
      if (plan.compute_copy) plan.params_bytes += pb * P;
      plan.grads_bytes += 4 * (plan.shard_grads ? S : P);
      plan.optimizer_bytes += 8 * owned;
      plan.host_params_bytes += 4 * owned;      // the mirror of master
      plan.host_optimizer_bytes += 8 * owned;  // and of m and v
    }
    if (plan.shared_unit[u]) {  // kept in dedicated full buffers
      if (plan.shard_params) plan.params_bytes += ub * P;
      if (plan.transient_grads && trains) plan.grads_bytes += 4 * P;
    } else {
      plan.largest_private_unit = std::max(plan.largest_private_unit, P);
      plan.gather_buffer_bytes = std::max(plan.gather_buffer_bytes, ub * P);
      ++private_units;
      if (trains) {
        plan.largest_trainable_private_unit = std::max(plan.largest_trainable_private_unit, P);
        ++private_trainable_units;
      }
    }
  }
  if (plan.shard_params) {
    // With resharding, the unit in use plus `prefetch` ahead (a unit is released in
    // its after_* hook, before the next unit's prefetch asks for a buffer); without
    // it, forward keeps every unit for backward.
    plan.param_pool = options.reshard_after_forward
                          ? std::min(private_units, options.prefetch + 1)
                          : private_units;
    plan.params_bytes += plan.param_pool * plan.gather_buffer_bytes;
  }
  if (plan.transient_grads) {
    // The unit being differentiated and the previous one still being reduced.
    plan.grad_pool = std::min(private_trainable_units, 2);
    plan.grads_bytes += plan.grad_pool * 4 * plan.largest_trainable_private_unit;
  }
  plan.host_grads_bytes += 4 * largest_owned;
  if (plan.shard_params) {
    // Walk one training micro-batch's schedule with the release rule.
    const FlatNeeds needs = flat_needs(layout, unit_needs);
    const std::vector<Step> schedule = training_schedule(layout.num_model_units());
    plan.gathers_per_micro_batch.assign(U, 0);
    std::vector<bool> gathered(U, false);
    for (size_t s = 0; s < schedule.size(); ++s)
      for (int v : needs[static_cast<size_t>(schedule[s].model_unit)]) {
        const size_t vv = static_cast<size_t>(v);
        if (!gathered[vv]) ++plan.gathers_per_micro_batch[vv];
        gathered[vv] = keeps_gathered(schedule, needs, s, v, !options.reshard_after_forward);
      }
  }
  return plan;
}

std::vector<MeshDims> FlatUnitStrategy::mesh_groups(const MeshShape& shape) {
  std::vector<MeshDims> groups = {partition_dims()};
  if (shape.size(MeshDim::replicate) > 1) groups.push_back({MeshDim::replicate});
  if (shape.expert_parallel_size() > 1) groups.push_back(expert_partition_dims(shape));
  return groups;
}

int FlatUnitStrategy::expert_holder(const UnitLayout& unit, int expert_parallel) {
  if (unit.expert < 0 || expert_parallel <= 1) return -1;
  return unit.expert / (unit.experts / expert_parallel);
}

FlatUnitStrategy::FlatUnitStrategy(const ParamLayout& layout,
                                   std::vector<std::vector<int>> unit_needs, DeviceMesh& mesh,
                                   const StrategyOptions& options, MemoryTracker& tracker,
                                   Backend& backend)
    : FlatUnitStrategy(layout, std::move(unit_needs), &mesh, nullptr, options, tracker, backend) {}

FlatUnitStrategy::FlatUnitStrategy(const ParamLayout& layout,
                                   std::vector<std::vector<int>> unit_needs, Communicator& world,
                                   const StrategyOptions& options, MemoryTracker& tracker,
                                   Backend& backend)
    : FlatUnitStrategy(layout, std::move(unit_needs), nullptr,
                       [&] {
                         const MeshShape shape = strategy_mesh(options, world.size());
                         return std::make_unique<DeviceMesh>(shape, world, mesh_groups(shape));
                       }(),
                       options, tracker, backend) {}

FlatUnitStrategy::FlatUnitStrategy(const ParamLayout& layout,
                                   std::vector<std::vector<int>> unit_needs, DeviceMesh* mesh,
                                   std::unique_ptr<DeviceMesh> owned_mesh,
                                   const StrategyOptions& options, MemoryTracker& tracker,
                                   Backend& backend)
    : layout_(layout),
      owned_mesh_(std::move(owned_mesh)),
      mesh_(mesh != nullptr ? *mesh : *owned_mesh_),
      shard_(nullptr),
      replica_(nullptr),
      options_(options),
      num_units_(layout.num_units()),
      num_model_units_(layout.num_model_units()),
      shard_params_(shards_parameters(options.kind)),
      transient_grads_(options.kind == StrategyKind::zero2 || shard_params_ ||
                       options.optimizer_on_host),
      reduce_wire_(options.reduce_dtype == DType::fp32 ? WireType::fp32 : WireType::bf16) {
  SHARDLM_CHECK(options.reduce_dtype == DType::fp32 || options.reduce_dtype == DType::bf16,
                "--reduce-dtype must be fp32 or bf16, got {}", dtype_name(options.reduce_dtype));
  SHARDLM_CHECK(static_cast<int>(unit_needs.size()) == num_model_units_,
                "internal: {} model units need lists for a layout of {} model units",
                unit_needs.size(), num_model_units_);
  for (const auto& placement : layout.model_units) unit_of_.push_back(placement.unit);
  first_model_unit_.assign(static_cast<size_t>(num_units_), -1);
  for (int m = num_model_units_ - 1; m >= 0; --m)
    first_model_unit_[static_cast<size_t>(unit_of_[static_cast<size_t>(m)])] = m;
  unit_needs_ = flat_needs(layout, unit_needs);
  SHARDLM_CHECK(options.prefetch >= 0, "--prefetch must be >= 0, got {}", options.prefetch);
  SHARDLM_CHECK(options.bucket_mb > 0, "--bucket-mb must be positive, got {}", options.bucket_mb);
  const int tensor_size = mesh_.shape().size(MeshDim::tensor);
  const MeshShape expected_mesh = strategy_mesh(options, world_size());
  SHARDLM_CHECK(mesh_.shape() == expected_mesh,
                "internal: strategy {} runs on mesh {}, was given {}", to_string(options.kind),
                expected_mesh.to_string(), mesh_.shape().to_string());
  SHARDLM_CHECK(layout.tensor.size == tensor_size,
                "internal: layout built for {} tensor rank(s), the mesh has {}", layout.tensor.size,
                tensor_size);
  if (tensor_size > 1) tensor_ = &mesh_.group({MeshDim::tensor});
  shard_ = &mesh_.group(partition_dims());
  const int E = options.expert_parallel;
  const int expert_rank = mesh_.shape().expert_rank(mesh_.rank());  // whose experts it holds
  if (mesh_.shape().size(MeshDim::replicate) > 1) replica_ = &mesh_.group({MeshDim::replicate});
  for (const UnitLayout& u : layout.units) {
    const int holder = expert_holder(u, E);
    if (holder >= 0)
      SHARDLM_CHECK(u.experts % E == 0,
                    "--expert-parallel {}: the model has {} experts per layer, which {} ranks "
                    "cannot share equally (expected a divisor of {})", E, u.experts, E, u.experts);
    partition_.push_back(holder < 0 ? shard_
                         : holder == expert_rank ? &mesh_.group(expert_partition_dims(mesh_.shape()))
                                                 : nullptr);
  }
  SHARDLM_CHECK(layout.world_size == shard_->size(),
                "internal: layout built for {} ranks, strategy partitions over {}",
                layout.world_size, shard_->size());

  const StrategyBufferPlan plan = plan_buffers(layout, unit_needs, options);
  model_param_ptrs_.assign(static_cast<size_t>(num_model_units_), ConstTypedPtr());
  model_grad_ptrs_.assign(static_cast<size_t>(num_model_units_), nullptr);
  model_units_of_.assign(static_cast<size_t>(num_units_), {});
  for (int m = 0; m < num_model_units_; ++m)
    model_units_of_[static_cast<size_t>(layout_.model_units[static_cast<size_t>(m)].unit)].push_back(m);
  units_.reserve(static_cast<size_t>(num_units_));
  for (int u = 0; u < num_units_; ++u) {
    const Communicator* p = partition_[static_cast<size_t>(u)];
    units_.emplace_back(layout, u, plan, p != nullptr ? p->rank() : 0, tracker, backend,
                        p != nullptr ? p->size() : 0, p != nullptr);
    units_.back().report_moves_to(&params_moved_, &grads_moved_);
    params_moved_.push_back(u);  // the buffers the constructor set
    grads_moved_.push_back(u);
  }
  gather_buffers_ = BufferPool(plan.param_pool, MemCategory::params,
                               static_cast<size_t>(plan.gather_buffer_bytes), tracker, backend);
  const size_t grad_buffer_bytes =
      static_cast<size_t>(plan.largest_trainable_private_unit) * sizeof(float);
  grad_buffers_ =
      BufferPool(plan.grad_pool, MemCategory::grads, grad_buffer_bytes, tracker, backend);

  train_schedule_ = training_schedule(num_model_units_);
  for (int m = 0; m < num_model_units_; ++m) eval_schedule_.push_back({false, m});

  // A bucket reduces over one partition: split where backward moves between the dense
  // units and experts (expert parallelism), leaving out experts held elsewhere.
  if (!transient_grads_)
    for (auto& units : plan_buckets(layout, options.bucket_mb)) {
      std::vector<int> part;
      for (int u : units) {
        if (!holds(u)) continue;
        if (!part.empty() && partition_[static_cast<size_t>(part.back())] != partition_[static_cast<size_t>(u)])
          buckets_.emplace_back(std::exchange(part, {}));
        part.push_back(u);
      }
      if (!part.empty()) buckets_.emplace_back(std::move(part));
    }
}

std::vector<std::vector<int>> FlatUnitStrategy::plan_buckets(const ParamLayout& layout,
                                                             double bucket_mb) {
  // Buckets of whole units in backward order; a small first bucket starts
  // communication early (as PyTorch DDP does).
  const double cap = bucket_mb * 1024.0 * 1024.0;
  const double first_cap = std::min(cap, 1024.0 * 1024.0);
  std::vector<std::vector<int>> buckets;
  double bytes = 0;
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    if (!layout.units[static_cast<size_t>(u)].trainable) continue;  // nothing to reduce
    if (buckets.empty() || bytes >= (buckets.size() == 1 ? first_cap : cap)) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(u);
    bytes += static_cast<double>(layout.units[static_cast<size_t>(u)].padded_numel) * 4.0;
  }
  return buckets;
}

std::vector<FlatUnitStrategy::Step> FlatUnitStrategy::training_schedule(int num_model_units) {
  std::vector<Step> schedule;
  for (int m = 0; m < num_model_units; ++m) schedule.push_back({false, m});
  for (int m = num_model_units - 1; m >= 0; --m) schedule.push_back({true, m});
  return schedule;
}

FlatUnitStrategy::~FlatUnitStrategy() {
  try {
    synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: strategy shutdown: %s\n", e.what());
  }
}

ParamPointers FlatUnitStrategy::params() {
  // The model reads one pointer per model unit: its flat unit's buffer plus its base.
  for (const int f : params_moved_) {
    const TypedPtr base = unit(f).params();
    for (const int m : model_units_of_[static_cast<size_t>(f)]) {
      const auto& place = layout_.model_units[static_cast<size_t>(m)];
      model_param_ptrs_[static_cast<size_t>(m)] =
          base.data != nullptr ? ConstTypedPtr(base.at(place.base)) : ConstTypedPtr();
    }
  }
  params_moved_.clear();
  return model_param_ptrs_;
}

UnitPointers FlatUnitStrategy::grads() {
  for (const int f : grads_moved_) {
    float* base = unit(f).grads();
    for (const int m : model_units_of_[static_cast<size_t>(f)]) {
      const auto& place = layout_.model_units[static_cast<size_t>(m)];
      model_grad_ptrs_[static_cast<size_t>(m)] = base != nullptr ? base + place.base : nullptr;
    }
  }
  grads_moved_.clear();
  return model_grad_ptrs_;
}

const float* FlatUnitStrategy::replicated_params(int unit) const {
  return units_[static_cast<size_t>(unit)].replicated_params();
}

OwnedSlice FlatUnitStrategy::owned(int index) { return unit(index).owned(); }

std::vector<std::vector<int>> FlatUnitStrategy::buckets() const {
  std::vector<std::vector<int>> units;
  for (const auto& bucket : buckets_) units.push_back(bucket.units());
  return units;
}

void FlatUnitStrategy::begin_step(int num_micro_batches) {
  SHARDLM_ASSERT(num_micro_batches >= 1);
  SHARDLM_ASSERT(pending_reduces_.empty());
  SHARDLM_ASSERT(std::none_of(buckets_.begin(), buckets_.end(),
                              [](const GradBucket& b) { return b.started(); }));
  num_micro_batches_ = num_micro_batches;
  for (auto& flat : units_) flat.zero_reduced_grads();
  if (options_.optimizer_on_host) {
    SHARDLM_CHECK(host_gradients_ != nullptr,
                  "internal: the optimizer is on the host but no host gradients were given");
    host_gradients_->zero();
  }
}

void FlatUnitStrategy::accumulate_gradients_on(HostGradients& host) {
  SHARDLM_CHECK(options_.optimizer_on_host,
                "internal: host gradients given to a strategy whose optimizer is on the device");
  host_gradients_ = &host;
  for (auto& flat : units_) flat.send_reduced_gradients_to(&host);
}

// ---- zero3: parameter gathering --------------------------------------------------

size_t FlatUnitStrategy::schedule_index(bool backward, int model_unit) const {
  if (!backward) return static_cast<size_t>(model_unit);
  return static_cast<size_t>(num_model_units_) + static_cast<size_t>(num_model_units_ - 1 - model_unit);
}

FlatUnitStrategy::FlatNeeds FlatUnitStrategy::flat_needs(
    const ParamLayout& layout, const std::vector<std::vector<int>>& unit_needs) {
  FlatNeeds needs;
  for (const auto& model_needs : unit_needs) {
    std::vector<int> flat;
    for (int v : model_needs) flat.push_back(layout.model_units[static_cast<size_t>(v)].unit);
    std::sort(flat.begin(), flat.end());
    flat.erase(std::unique(flat.begin(), flat.end()), flat.end());
    needs.push_back(std::move(flat));
  }
  return needs;
}

bool FlatUnitStrategy::step_needs(const std::vector<Step>& schedule, const FlatNeeds& needs,
                                  size_t step, int unit) {
  const auto& n = needs[static_cast<size_t>(schedule[step].model_unit)];
  return std::find(n.begin(), n.end(), unit) != n.end();
}

bool FlatUnitStrategy::keeps_gathered(const std::vector<Step>& schedule, const FlatNeeds& needs,
                                      size_t cursor, int v, bool keep_forward_units) {
  if (cursor + 1 == schedule.size()) return false;
  // Forward: kept for the next step, or (without resharding) through backward.
  if (!schedule[cursor].backward)
    return keep_forward_units || step_needs(schedule, needs, cursor + 1, v);
  // Backward: kept while a later step needs it.
  for (size_t s = cursor + 1; s < schedule.size(); ++s)
    if (step_needs(schedule, needs, s, v)) return true;
  return false;
}

void FlatUnitStrategy::ensure_gathered(int index) {
  FlatUnit& flat = unit(index);
  if (!flat.gathered()) flat.start_gather(gather_buffers_, partition(index));
  flat.finish_gather();
}

// Called from the hooks of units this rank reads only: a unit held elsewhere (expert
// parallelism: no needs here) must not top the window up again, or a rank whose
// experts come early would start the world's gathers of the units after a layer's
// experts before that layer's expert exchange, and its peers after it (a deadlock).
void FlatUnitStrategy::prefetch_after(size_t cursor) {
  int issued = 0;
  for (size_t s = cursor + 1; s < schedule_->size() && issued < options_.prefetch; ++s) {
    for (int v : unit_needs_[static_cast<size_t>((*schedule_)[s].model_unit)]) {
      FlatUnit& flat = unit(v);
      if (flat.gathered()) continue;
      if (!flat.shared() && !gather_buffers_.has_free()) return;
      flat.start_gather(gather_buffers_, partition(v));
      if (++issued == options_.prefetch) return;
    }
  }
}

void FlatUnitStrategy::release_after(size_t cursor) {
  const Step& step = (*schedule_)[cursor];
  for (int v : unit_needs_[static_cast<size_t>(step.model_unit)])
    if (!keeps_gathered(*schedule_, unit_needs_, cursor, v,
                        training_ && !options_.reshard_after_forward))
      unit(v).release_gather(gather_buffers_);
}

// ---- zero2/zero3: gradient buffers and reduce-scatter ------------------------------

void FlatUnitStrategy::acquire_grads(int index) {
  FlatUnit& flat = unit(index);
  if (!flat.trainable()) return;  // a frozen unit gets no gradient
  // A buffer still being reduced from the previous micro-batch must be consumed
  // before this micro-batch accumulates again.
  while (flat.reduce_pending()) consume_oldest_reduce();
  if (flat.grads() != nullptr) return;  // held for this micro-batch already
  if (!flat.shared())
    while (!grad_buffers_.has_free() && !pending_reduces_.empty()) consume_oldest_reduce();
  flat.acquire_grads(grad_buffers_);
}

void FlatUnitStrategy::consume_oldest_reduce() {
  const int oldest = pending_reduces_.front();
  pending_reduces_.pop_front();
  unit(oldest).finish_reduce(replica_, grad_buffers_);
}

// ---- hooks --------------------------------------------------------------------------

void FlatUnitStrategy::before_forward(int model_unit, bool training) {
  training_ = training;
  const auto& unit_needs = unit_needs_[static_cast<size_t>(model_unit)];
  if (shard_params_) {
    schedule_ = training ? &train_schedule_ : &eval_schedule_;
    const size_t cursor = schedule_index(false, model_unit);
    for (int v : unit_needs) ensure_gathered(v);
    if (!unit_needs.empty()) prefetch_after(cursor);
  } else {
    for (int v : unit_needs) refresh_replicated_params(v);
  }
  // The last model unit computes the loss, and with it the LM head's gradient, during
  // its training forward: it writes the gradients of every unit it reads (its own,
  // and the embeddings' when the head is tied).
  if (transient_grads_ && training && model_unit == num_model_units_ - 1)
    for (int v : unit_needs) acquire_grads(v);
}

void FlatUnitStrategy::after_forward(int model_unit) {
  if (shard_params_) release_after(schedule_index(false, model_unit));
}

void FlatUnitStrategy::before_backward(int model_unit) {
  const auto& unit_needs = unit_needs_[static_cast<size_t>(model_unit)];
  if (shard_params_) {
    schedule_ = &train_schedule_;
    const size_t cursor = schedule_index(true, model_unit);
    for (int v : unit_needs) ensure_gathered(v);
    if (!unit_needs.empty()) prefetch_after(cursor);
  } else {
    for (int v : unit_needs) refresh_replicated_params(v);
  }
  if (transient_grads_)
    for (int v : unit_needs) acquire_grads(v);
}

void FlatUnitStrategy::after_backward(int model_unit, int micro_batch) {
  const int index = unit_of_[static_cast<size_t>(model_unit)];
  FlatUnit& flat = unit(index);
  // A flat unit's gradient is complete once backward reached its first model unit.
  const bool complete =
      first_model_unit_[static_cast<size_t>(index)] == model_unit && flat.trainable() &&
      holds(index);
  if (complete && transient_grads_) {
    flat.start_reduce(partition(index), reduce_wire_);
    pending_reduces_.push_back(index);
  } else if (complete && micro_batch == num_micro_batches_ - 1) {
    // no_sync: only the last micro-batch communicates; a bucket goes as soon as its
    // last unit (in backward order) has its gradient.
    for (auto& bucket : buckets_)
      if (bucket.last_unit() == index)
        bucket.start_reduce(units_, partition(index), reduce_wire_,
                            /*all_gather_after=*/options_.kind == StrategyKind::ddp);
  }
  if (shard_params_) release_after(schedule_index(true, model_unit));
}

void FlatUnitStrategy::finish_gradients() {
  // Buckets start in index order (backward reaches their last units in that order).
  for (auto& bucket : buckets_) bucket.finish_reduce();
  while (!pending_reduces_.empty()) consume_oldest_reduce();
}

double FlatUnitStrategy::global_grad_norm_squared() {
  double local = 0.0;
  for (auto& flat : units_)
    if (flat.trainable()) local += flat.reduced_grad_sum_of_squares();
  // Replicas (hybrid) hold the same reduced values: sum over the partition only (with
  // expert parallelism the dense one, shard x expert: each expert's slices are owned in
  // the one expert coordinate that holds it).
  if (tensor_ == nullptr) {
    shard_->all_reduce_blocking(std::span<double>(&local, 1), ReduceOp::sum, "grad norm");
    return local;
  }
  // Tensor parallelism: the pieces of split tensors differ between tensor ranks (summed
  // over the tensor group too), whole tensors are the same on all of them (once).
  // A piece held by several tensor ranks (GQA's key/value heads over more ranks than
  // heads) counts on the first of them only.
  double sums[2] = {0.0, local};  // pieces, whole
  for (int u = 0; u < num_units_; ++u) {
    FlatUnit& flat = units_[static_cast<size_t>(u)];
    if (!flat.trainable()) continue;
    for (const ParamInfo& p : layout_.units[static_cast<size_t>(u)].params) {
      if (p.piece.whole()) continue;
      const double piece = flat.reduced_grad_sum_of_squares(p.offset, p.offset + p.numel);
      const int64_t pieces = p.piece.full / p.shape[static_cast<size_t>(p.piece.dim)];
      const int64_t holders = layout_.tensor.size / pieces;
      sums[1] -= piece;
      if (layout_.tensor.rank % holders == 0) sums[0] += piece;
    }
  }
  shard_->all_reduce_blocking(std::span<double>(sums, 2), ReduceOp::sum, "grad norm");
  tensor_->all_reduce_blocking(std::span<double>(sums, 1), ReduceOp::sum, "grad norm (tensor)");
  return sums[0] + sums[1];
}

void FlatUnitStrategy::after_step() {
  SHARDLM_CHECK(gathered_units() == 0 && pending_reductions() == 0,
                "internal: step ended with {} units gathered and {} reductions in flight",
                gathered_units(), pending_reductions());
  // ddp's optimizer wrote the compute copy with the masters (OwnedSlice::compute_copy);
  // zero1/zero2 rebuild it from the gathered masters.
  gather_updated_params(/*frozen_too=*/false);
}

void FlatUnitStrategy::gather_updated_params(bool frozen_too) {
  // Frozen units never change, so their copies stay valid after a step.
  if (options_.kind != StrategyKind::ddp)
    for (auto& flat : units_)
      if (frozen_too || flat.trainable()) flat.mark_compute_copy_stale();
  if (options_.kind == StrategyKind::zero1 || options_.kind == StrategyKind::zero2) {
    // Owners updated their slices in place; gather them back, waited for lazily
    // before each unit's next forward.
    for (int u = 0; u < num_units_; ++u)
      if (holds(u) && (frozen_too || unit(u).trainable())) unit(u).start_param_sync(partition(u));
  }
}

void FlatUnitStrategy::after_load() {
  for (auto& flat : units_) flat.mark_compute_copy_stale();
  if (options_.kind == StrategyKind::ddp) {
    // sync_module_states: every replica starts from rank 0's weights.
    for (int u = 0; u < num_units_; ++u)
      if (holds(u)) unit(u).broadcast_params(partition(u), /*root=*/0);
  } else if (!shard_params_) {
    gather_updated_params(/*frozen_too=*/true);
    synchronize();
  }
}

void FlatUnitStrategy::refresh_replicated_params(int index) {
  FlatUnit& flat = unit(index);
  flat.finish_param_sync();
  flat.refresh_compute_copy();
}

void FlatUnitStrategy::synchronize() {
  for (auto& flat : units_) flat.finish_param_sync();
  finish_gradients();
  for (auto& flat : units_) flat.release_gather(gather_buffers_);
}

bool FlatUnitStrategy::writes_checkpoint() const {
  // (With tensor parallelism the first data rank of every tensor rank: it holds its pieces;
  // context ranks hold the same as their group's first, unless the expert group spans them;
  // with expert parallelism the first rank of each place in the expert group, which writes
  // its experts: OwnedState::writes_unit.)
  if (options_.kind == StrategyKind::ddp)
    return mesh_.coordinate(MeshDim::shard) == 0 && mesh_.coordinate(MeshDim::replicate) == 0 &&
           (mesh_.coordinate(MeshDim::context) == 0 || mesh_.shape().expert_spans_context());
  return mesh_.coordinate(MeshDim::replicate) == 0;  // the first replica writes
}

bool FlatUnitStrategy::writes_unit(int index) const {
  if (partition_[static_cast<size_t>(index)] == nullptr) return false;  // held elsewhere
  if (options_.kind != StrategyKind::ddp) return true;
  // ddp: each rank owns its units whole; a dense unit is written by rank 0 alone.
  return partition_[static_cast<size_t>(index)] != shard_ ||
         mesh_.shape().expert_rank(mesh_.rank()) == 0;
}

CommCounters FlatUnitStrategy::take_group_counters() { return mesh_.take_group_counters(); }

int FlatUnitStrategy::gathered_units() const {
  return static_cast<int>(std::count_if(units_.begin(), units_.end(),
                                        [](const FlatUnit& flat) { return flat.gathered(); }));
}

int FlatUnitStrategy::pending_reductions() const {
  int n = static_cast<int>(pending_reduces_.size());
  for (const auto& bucket : buckets_) n += bucket.pending();
  return n;
}

}  // namespace shardlm
