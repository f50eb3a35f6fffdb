#include "shardlm/parallel/flat_unit_strategy.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/optim/adamw.hpp"

namespace shardlm {

namespace {

TrackedBuffer floats(MemCategory category, int64_t count, MemoryTracker& tracker) {
  return TrackedBuffer(category, static_cast<size_t>(count) * sizeof(float), tracker);
}

TrackedBuffer elements(MemCategory category, DType type, int64_t count, MemoryTracker& tracker) {
  return TrackedBuffer(category, static_cast<size_t>(count) * dtype_bytes(type), tracker);
}

bool shards_params(const StrategyOptions& options) {
  return options.kind == StrategyKind::zero3 || options.kind == StrategyKind::hybrid;
}

// The type params() hands the model: zero3/hybrid gather in the compute type; the
// replicated strategies keep a bf16 copy of their fp32 parameters in a bf16 run
// (rounded once per step instead of by the model at every use), and hand fp16 runs
// fp32, which the model rounds to fp16 values itself (there is no fp16 GEMM).
DType model_param_type(const StrategyOptions& options) {
  if (shards_params(options) || options.param_dtype == DType::bf16) return options.param_dtype;
  return DType::fp32;
}

void zero_floats(float* data, int64_t count) {
  std::memset(data, 0, static_cast<size_t>(count) * sizeof(float));
}

}  // namespace

StrategyBufferPlan FlatUnitStrategy::plan_buffers(const ParamLayout& layout,
                                                  const std::vector<std::vector<int>>& unit_needs,
                                                  const StrategyOptions& options) {
  StrategyBufferPlan plan;
  plan.shard_params = shards_params(options);
  plan.shard_grads = options.kind == StrategyKind::zero2 || plan.shard_params;
  plan.shard_optimizer = options.kind != StrategyKind::ddp;
  plan.param_type = model_param_type(options);
  plan.compute_copy = !plan.shard_params && plan.param_type != DType::fp32;
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
  for (size_t u = 0; u < U; ++u) {
    const int64_t P = layout.units[u].padded_numel;
    const int64_t S = P / layout.world_size;
    const bool trains = layout.units[u].trainable;
    const bool raw = layout.units[u].raw;
    const int64_t ub = raw ? 4 : pb;  // bytes per element as the model reads it
    // A frozen unit keeps its parameters only (MemCategory::frozen).
    int64_t& param_bytes = trains ? plan.params_bytes : plan.frozen_bytes;
    param_bytes += 4 * (plan.shard_params ? S : P);
    if (plan.compute_copy && !raw) param_bytes += pb * P;
    if (trains) {
      plan.grads_bytes += 4 * (plan.shard_grads ? S : P);
      plan.optimizer_bytes += 8 * (plan.shard_optimizer ? S : P);
    }
    if (plan.shared_unit[u]) {  // kept in dedicated full buffers
      if (plan.shard_params) plan.params_bytes += ub * P;
      if (plan.shard_grads && trains) plan.grads_bytes += 4 * P;
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
  if (plan.shard_grads) {
    // The unit being differentiated and the previous one still being reduced.
    plan.grad_pool = std::min(private_trainable_units, 2);
    plan.grads_bytes += plan.grad_pool * 4 * plan.largest_trainable_private_unit;
  }
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

FlatUnitStrategy::FlatUnitStrategy(const ParamLayout& layout,
                                   std::vector<std::vector<int>> unit_needs, Communicator& world,
                                   const StrategyOptions& options, MemoryTracker& tracker)
    : layout_(layout),
      world_(world),
      shard_(&world),
      replica_(nullptr),
      options_(options),
      tracker_(tracker),
      num_units_(layout.num_units()),
      num_model_units_(layout.num_model_units()),
      shard_rank_(0),
      shard_size_(1),
      shard_params_(shards_params(options)),
      shard_grads_(options.kind == StrategyKind::zero2 || shard_params_),
      shard_optimizer_(options.kind != StrategyKind::ddp),
      param_type_(model_param_type(options)),
      reduce_wire_(options.reduce_dtype == DType::fp32 ? WireType::fp32 : WireType::bf16) {
  SHARDLM_CHECK(options.reduce_dtype == DType::fp32 || options.reduce_dtype == DType::bf16,
                "--reduce-dtype must be fp32 or bf16, got {}", dtype_name(options.reduce_dtype));
  SHARDLM_CHECK(static_cast<int>(unit_needs.size()) == num_model_units_,
                "internal: {} model units need lists for a layout of {} model units",
                unit_needs.size(), num_model_units_);
  for (const auto& placement : layout.model_units) unit_of_.push_back(placement.unit);
  first_model_unit_.assign(static_cast<size_t>(num_units_), -1);
  for (int m = num_model_units_ - 1; m >= 0; --m) first_model_unit_[static_cast<size_t>(unit_of_[static_cast<size_t>(m)])] = m;
  unit_needs_ = flat_needs(layout, unit_needs);
  SHARDLM_CHECK(options.prefetch >= 0, "--prefetch must be >= 0, got {}", options.prefetch);
  SHARDLM_CHECK(options.bucket_mb > 0, "--bucket-mb must be positive, got {}", options.bucket_mb);
  if (options.kind == StrategyKind::hybrid) {
    const int g = partition_size(options, world.size());
    shard_group_ = world.split(world.rank() / g, world.rank(), "shard group");
    replica_group_ = world.split(world.rank() % g, world.rank(), "replica group");
    shard_ = shard_group_.get();
    if (replica_group_->size() > 1) replica_ = replica_group_.get();
  }
  shard_rank_ = shard_->rank();
  shard_size_ = shard_->size();
  SHARDLM_CHECK(layout.world_size == shard_size_,
                "internal: layout built for {} ranks, strategy partitions over {}",
                layout.world_size, shard_size_);

  const StrategyBufferPlan plan = plan_buffers(layout, unit_needs, options);
  shared_unit_ = plan.shared_unit;
  for (const auto& unit : layout.units) {
    trainable_.push_back(unit.trainable);
    raw_.push_back(unit.raw);
    SHARDLM_CHECK(!unit.raw || !unit.trainable, "internal: raw unit {} is trainable", unit.name);
  }
  compute_copy_ = plan.compute_copy;
  model_param_ptrs_.assign(static_cast<size_t>(num_model_units_), ConstTypedPtr());
  model_grad_ptrs_.assign(static_cast<size_t>(num_model_units_), nullptr);

  const size_t U = static_cast<size_t>(num_units_);
  full_params_.resize(U);
  owned_params_.resize(U);
  full_grads_.resize(U);
  owned_grads_.resize(U);
  adam_m_.resize(U);
  adam_v_.resize(U);
  dedicated_params_.resize(U);
  dedicated_grads_.resize(U);
  param_ptrs_.assign(U, TypedPtr());
  grad_ptrs_.assign(U, nullptr);
  param_buffer_of_.assign(U, -1);
  grad_buffer_of_.assign(U, -1);
  gather_state_.assign(U, GatherState::none);
  gather_work_.resize(U);
  param_sync_.resize(U);
  compute_params_.resize(U);
  compute_params_stale_.assign(U, true);

  for (size_t u = 0; u < U; ++u) {
    const int64_t P = layout.units[u].padded_numel;
    const int64_t S = P / shard_size_;
    const MemCategory param_category = trainable_[u] ? MemCategory::params : MemCategory::frozen;
    if (shard_params_) {
      owned_params_[u] = floats(param_category, S, tracker);
    } else {
      full_params_[u] = floats(param_category, P, tracker);
      if (compute_copy_ && !raw_[u]) {
        compute_params_[u] = elements(param_category, param_type_, P, tracker);
        param_ptrs_[u] = TypedPtr(compute_params_[u].data(), param_type_);
      } else {
        param_ptrs_[u] = full_params_[u].as<float>();
      }
    }
    if (shared_unit_[u] && shard_params_)
      dedicated_params_[u] = elements(MemCategory::params, unit_param_type(u), P, tracker);
    if (!trainable_[u]) continue;  // no gradients, no optimizer state
    if (shard_grads_) {
      owned_grads_[u] = floats(MemCategory::grads, S, tracker);
    } else {
      full_grads_[u] = floats(MemCategory::grads, P, tracker);
      grad_ptrs_[u] = full_grads_[u].as<float>();
    }
    const int64_t optimizer_numel = shard_optimizer_ ? S : P;
    adam_m_[u] = floats(MemCategory::optimizer, optimizer_numel, tracker);
    adam_v_[u] = floats(MemCategory::optimizer, optimizer_numel, tracker);
    if (shared_unit_[u] && shard_grads_) dedicated_grads_[u] = floats(MemCategory::grads, P, tracker);
  }
  for (int i = 0; i < plan.param_pool; ++i) {
    param_pool_.push_back(TrackedBuffer(MemCategory::params,
                                        static_cast<size_t>(plan.gather_buffer_bytes), tracker));
    free_param_buffers_.push_back(i);
  }
  for (int i = 0; i < plan.grad_pool; ++i) {
    grad_pool_.push_back(floats(MemCategory::grads, plan.largest_trainable_private_unit, tracker));
    free_grad_buffers_.push_back(i);
  }

  train_schedule_ = training_schedule(num_model_units_);
  for (int m = 0; m < num_model_units_; ++m) eval_schedule_.push_back({false, m});

  if (!shard_grads_) {
    buckets_ = plan_buckets(layout, options.bucket_mb);
    bucket_of_unit_.assign(U, -1);
    for (size_t b = 0; b < buckets_.size(); ++b)
      for (int u : buckets_[b]) bucket_of_unit_[static_cast<size_t>(u)] = static_cast<int>(b);
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

// The model reads one pointer per model unit: its flat unit's buffer plus its base.
template <typename Out, typename In>
static std::span<const Out> model_unit_pointers(const ParamLayout& layout,
                                                const std::vector<In>& unit_ptrs,
                                                std::vector<Out>& out) {
  for (size_t m = 0; m < out.size(); ++m) {
    const auto& place = layout.model_units[m];
    const In& base = unit_ptrs[static_cast<size_t>(place.unit)];
    if constexpr (std::is_pointer_v<In>) {
      out[m] = base != nullptr ? base + place.base : nullptr;
    } else {
      out[m] = base.data != nullptr ? Out(base.at(place.base)) : Out();
    }
  }
  return out;
}

ParamPointers FlatUnitStrategy::params() {
  return model_unit_pointers(layout_, param_ptrs_, model_param_ptrs_);
}

UnitPointers FlatUnitStrategy::grads() {
  return model_unit_pointers(layout_, grad_ptrs_, model_grad_ptrs_);
}

const float* FlatUnitStrategy::replicated_params(int unit) const {
  return shard_params_ ? nullptr : full_params_[static_cast<size_t>(unit)].as<float>();
}

OwnedSlice FlatUnitStrategy::owned(int unit) {
  const size_t u = static_cast<size_t>(unit);
  const int64_t P = layout_.units[u].padded_numel;
  const int64_t S = P / shard_size_;
  const int64_t b = shard_rank_ * S;
  float* m = adam_m_[u].as<float>();
  float* v = adam_v_[u].as<float>();
  if (!trainable_[u]) {
    // A frozen unit: its parameters only (loaded, checkpointed, never updated).
    float* master = shard_params_ ? owned_params_[u].as<float>()
                                  : full_params_[u].as<float>() + (options_.kind == StrategyKind::ddp ? 0 : b);
    return options_.kind == StrategyKind::ddp ? OwnedSlice{0, P, master, nullptr, nullptr, nullptr, {}}
                                              : OwnedSlice{b, b + S, master, nullptr, nullptr, nullptr, {}};
  }
  switch (options_.kind) {
    case StrategyKind::ddp:
      // The whole unit is owned, so the optimizer can keep the compute copy current.
      return {0, P, full_params_[u].as<float>(), full_grads_[u].as<float>(), m, v,
              compute_copy_ ? param_ptrs_[u] : TypedPtr()};
    case StrategyKind::zero1:
      return {b, b + S, full_params_[u].as<float>() + b, full_grads_[u].as<float>() + b, m, v, {}};
    case StrategyKind::zero2:
      return {b, b + S, full_params_[u].as<float>() + b, owned_grads_[u].as<float>(), m, v, {}};
    case StrategyKind::zero3:
    case StrategyKind::hybrid:
      return {b, b + S, owned_params_[u].as<float>(), owned_grads_[u].as<float>(), m, v, {}};
  }
  SHARDLM_ASSERT(false);
  return {};
}

float* FlatUnitStrategy::owned_grad_slice(int unit) {
  const size_t u = static_cast<size_t>(unit);
  if (!trainable_[u]) return nullptr;
  if (shard_grads_) return owned_grads_[u].as<float>();
  const int64_t S = layout_.units[u].padded_numel / shard_size_;
  return full_grads_[u].as<float>() + shard_rank_ * S;
}

void FlatUnitStrategy::begin_step(int num_micro_batches) {
  SHARDLM_ASSERT(num_micro_batches >= 1);
  SHARDLM_ASSERT(pending_reduces_.empty() && bucket_works_.empty());
  num_micro_batches_ = num_micro_batches;
  for (auto& g : shard_grads_ ? owned_grads_ : full_grads_)
    if (g.bytes() > 0) std::memset(g.data(), 0, g.bytes());  // frozen units hold none
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

void FlatUnitStrategy::start_gather(int unit) {
  const size_t u = static_cast<size_t>(unit);
  void* buffer = nullptr;
  if (shared_unit_[u]) {
    buffer = dedicated_params_[u].data();
    param_buffer_of_[u] = -2;
  } else {
    SHARDLM_CHECK(!free_param_buffers_.empty(),
                  "internal: no free gather buffer for unit {} (pool of {})", layout_.units[u].name,
                  param_pool_.size());
    param_buffer_of_[u] = free_param_buffers_.back();
    free_param_buffers_.pop_back();
    buffer = param_pool_[static_cast<size_t>(param_buffer_of_[u])].data();
  }
  const int64_t S = layout_.units[u].padded_numel / shard_size_;
  const TypedPtr gathered(buffer, unit_param_type(u));
  const std::string label = "all_gather params unit " + layout_.units[u].name;
  const float* owned = owned_params_[u].as<float>();
  if (gathered.dtype == DType::fp32) {  // raw units' words travel as they are
    gather_work_[u] = shard_->all_gather(owned, gathered.f32(), static_cast<size_t>(S), label);
  } else {
    // This rank's block is rounded in place in the gather buffer, then gathered.
    const TypedPtr mine = gathered.at(shard_rank_ * S);
    cpu::convert(mine, owned, S);
    gather_work_[u] = shard_->all_gather_bytes(
        mine.data, buffer, static_cast<size_t>(S) * dtype_bytes(param_type_), label);
  }
  gather_state_[u] = GatherState::in_flight;
  param_ptrs_[u] = gathered;
}

void FlatUnitStrategy::ensure_gathered(int unit) {
  const size_t u = static_cast<size_t>(unit);
  if (gather_state_[u] == GatherState::none) start_gather(unit);
  if (gather_state_[u] == GatherState::in_flight) {
    gather_work_[u].wait();
    gather_state_[u] = GatherState::ready;
  }
}

void FlatUnitStrategy::release_params(int unit) {
  const size_t u = static_cast<size_t>(unit);
  if (gather_state_[u] == GatherState::none) return;
  gather_work_[u].wait();
  if (param_buffer_of_[u] >= 0) free_param_buffers_.push_back(param_buffer_of_[u]);
  param_buffer_of_[u] = -1;
  gather_state_[u] = GatherState::none;
  param_ptrs_[u] = TypedPtr();
}

void FlatUnitStrategy::prefetch_after(size_t cursor) {
  int issued = 0;
  for (size_t s = cursor + 1; s < schedule_->size() && issued < options_.prefetch; ++s) {
    for (int v : unit_needs_[static_cast<size_t>((*schedule_)[s].model_unit)]) {
      if (gather_state_[static_cast<size_t>(v)] != GatherState::none) continue;
      if (!shared_unit_[static_cast<size_t>(v)] && free_param_buffers_.empty()) return;
      start_gather(v);
      if (++issued == options_.prefetch) return;
    }
  }
}

void FlatUnitStrategy::release_after(size_t cursor) {
  const Step& step = (*schedule_)[cursor];
  for (int v : unit_needs_[static_cast<size_t>(step.model_unit)])
    if (!keeps_gathered(*schedule_, unit_needs_, cursor, v,
                        training_ && !options_.reshard_after_forward))
      release_params(v);
}

// ---- zero2/zero3: gradient buffers and reduce-scatter ------------------------------

void FlatUnitStrategy::acquire_grads(int unit) {
  const size_t u = static_cast<size_t>(unit);
  if (!trainable_[u]) return;  // a frozen unit gets no gradient
  // A buffer still being reduced from the previous micro-batch must be consumed
  // before this micro-batch accumulates again.
  auto in_flight = [&] {
    return std::any_of(pending_reduces_.begin(), pending_reduces_.end(),
                       [&](const PendingReduce& p) { return p.unit == unit; });
  };
  while (in_flight()) consume_oldest_reduce();
  if (grad_ptrs_[u] != nullptr) return;  // held for this micro-batch already
  float* buffer = nullptr;
  if (shared_unit_[u]) {
    buffer = dedicated_grads_[u].as<float>();
    grad_buffer_of_[u] = -2;
  } else {
    while (free_grad_buffers_.empty() && !pending_reduces_.empty()) consume_oldest_reduce();
    SHARDLM_CHECK(!free_grad_buffers_.empty(), "internal: no free gradient buffer for unit {}",
                  layout_.units[u].name);
    grad_buffer_of_[u] = free_grad_buffers_.back();
    free_grad_buffers_.pop_back();
    buffer = grad_pool_[static_cast<size_t>(grad_buffer_of_[u])].as<float>();
  }
  zero_floats(buffer, layout_.units[u].padded_numel);
  grad_ptrs_[u] = buffer;
}

void FlatUnitStrategy::consume_oldest_reduce() {
  PendingReduce p = std::move(pending_reduces_.front());
  pending_reduces_.pop_front();
  p.work.wait();
  const size_t u = static_cast<size_t>(p.unit);
  const int64_t S = layout_.units[u].padded_numel / shard_size_;
  float* reduced = grad_ptrs_[u] + shard_rank_ * S;
  if (replica_ != nullptr)
    replica_->all_reduce(reduced, static_cast<size_t>(S), ReduceOp::sum,
                         "all_reduce grads across replicas unit " + layout_.units[u].name)
        .wait();
  float* owned = owned_grads_[u].as<float>();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < S; ++i) owned[i] += reduced[i];
  if (grad_buffer_of_[u] >= 0) free_grad_buffers_.push_back(grad_buffer_of_[u]);
  grad_buffer_of_[u] = -1;
  grad_ptrs_[u] = nullptr;
}

// ---- ddp/zero1: buckets -------------------------------------------------------------

void FlatUnitStrategy::launch_bucket(size_t bucket) {
  for (int unit : buckets_[bucket]) {
    const size_t u = static_cast<size_t>(unit);
    const int64_t S = layout_.units[u].padded_numel / shard_size_;
    float* grads = full_grads_[u].as<float>();
    float* mine = grads + shard_rank_ * S;
    const std::string& name = layout_.units[u].name;
    bucket_works_.push_back(shard_->reduce_scatter(grads, mine, static_cast<size_t>(S),
                                                   ReduceOp::sum, "reduce_scatter grads unit " + name,
                                                   reduce_wire_));
    // DDP's all-reduce, as reduce-scatter + all-gather over the same partition as
    // the sharded strategies, so all of them sum each element the same way.
    if (options_.kind == StrategyKind::ddp)
      bucket_works_.push_back(
          shard_->all_gather(mine, grads, static_cast<size_t>(S), "all_gather grads unit " + name));
  }
}

// ---- hooks --------------------------------------------------------------------------

void FlatUnitStrategy::before_forward(int model_unit, bool training) {
  training_ = training;
  const auto& unit_needs = unit_needs_[static_cast<size_t>(model_unit)];
  if (shard_params_) {
    schedule_ = training ? &train_schedule_ : &eval_schedule_;
    const size_t cursor = schedule_index(false, model_unit);
    for (int v : unit_needs) ensure_gathered(v);
    prefetch_after(cursor);
  } else {
    for (int v : unit_needs) refresh_compute_params(v);
  }
  // The last model unit computes the loss, and with it the LM head's gradient, during
  // its training forward: it writes the gradients of every unit it reads (its own,
  // and the embeddings' when the head is tied).
  if (shard_grads_ && training && model_unit == num_model_units_ - 1)
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
    prefetch_after(cursor);
  } else {
    for (int v : unit_needs) refresh_compute_params(v);
  }
  if (shard_grads_)
    for (int v : unit_needs) acquire_grads(v);
}

void FlatUnitStrategy::after_backward(int model_unit, int micro_batch) {
  const int unit = unit_of_[static_cast<size_t>(model_unit)];
  const size_t u = static_cast<size_t>(unit);
  // A flat unit's gradient is complete once backward reached its first model unit.
  const bool complete = first_model_unit_[u] == model_unit && trainable_[u];
  if (complete && shard_grads_) {
    const int64_t S = layout_.units[u].padded_numel / shard_size_;
    float* grads = grad_ptrs_[u];
    pending_reduces_.push_back(
        {unit, shard_->reduce_scatter(grads, grads + shard_rank_ * S, static_cast<size_t>(S),
                                      ReduceOp::sum,
                                      "reduce_scatter grads unit " + layout_.units[u].name,
                                      reduce_wire_)});
  } else if (complete && micro_batch == num_micro_batches_ - 1) {
    // no_sync: only the last micro-batch communicates; a bucket goes as soon as its
    // last unit (in backward order) has its gradient.
    const int b = bucket_of_unit_[u];
    if (buckets_[static_cast<size_t>(b)].back() == unit) launch_bucket(static_cast<size_t>(b));
  }
  if (shard_params_) release_after(schedule_index(true, model_unit));
}

void FlatUnitStrategy::finish_gradients() {
  for (auto& w : bucket_works_) w.wait();
  bucket_works_.clear();
  while (!pending_reduces_.empty()) consume_oldest_reduce();
}

double FlatUnitStrategy::global_grad_norm_squared() {
  double local = 0.0;
  for (int u = 0; u < num_units_; ++u)
    if (trainable_[static_cast<size_t>(u)])
      local += sum_of_squares(owned_grad_slice(u),
                              layout_.units[static_cast<size_t>(u)].padded_numel / shard_size_);
  // Replicas (hybrid) hold the same reduced values: sum over the shard group only.
  shard_->all_reduce_blocking(std::span<double>(&local, 1), ReduceOp::sum, "grad norm");
  return local;
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
    for (size_t u = 0; u < compute_params_stale_.size(); ++u)
      if (frozen_too || trainable_[u]) compute_params_stale_[u] = true;
  if (options_.kind == StrategyKind::zero1 || options_.kind == StrategyKind::zero2) {
    // Owners updated their slices in place; gather them back, waited for lazily
    // before each unit's next forward.
    for (int u = 0; u < num_units_; ++u) {
      const size_t uu = static_cast<size_t>(u);
      if (!frozen_too && !trainable_[uu]) continue;
      const int64_t S = layout_.units[uu].padded_numel / shard_size_;
      float* full = full_params_[uu].as<float>();
      param_sync_[uu] = shard_->all_gather(full + shard_rank_ * S, full, static_cast<size_t>(S),
                                           "all_gather params unit " + layout_.units[uu].name);
    }
  }
}

void FlatUnitStrategy::after_load() {
  compute_params_stale_.assign(compute_params_stale_.size(), true);
  if (options_.kind == StrategyKind::ddp) {
    // sync_module_states: every replica starts from rank 0's weights.
    for (int u = 0; u < num_units_; ++u) {
      const size_t uu = static_cast<size_t>(u);
      shard_->broadcast(full_params_[uu].data(), full_params_[uu].bytes(), 0,
                        "broadcast initial params unit " + layout_.units[uu].name)
          .wait();
    }
  } else if (!shard_params_) {
    gather_updated_params(/*frozen_too=*/true);
    synchronize();
  }
}

void FlatUnitStrategy::refresh_compute_params(int unit) {
  const size_t u = static_cast<size_t>(unit);
  param_sync_[u].wait();
  if (!compute_copy_ || raw_[u] || !compute_params_stale_[u]) return;
  cpu::convert(param_ptrs_[u], full_params_[u].as<float>(), layout_.units[u].padded_numel);
  compute_params_stale_[u] = false;
}

void FlatUnitStrategy::synchronize() {
  for (auto& w : param_sync_) w.wait();
  finish_gradients();
  for (int u = 0; u < num_units_; ++u) release_params(u);
}

bool FlatUnitStrategy::writes_checkpoint() const {
  if (options_.kind == StrategyKind::ddp) return world_.rank() == 0;
  return replica_ == nullptr || replica_->rank() == 0;
}

CommCounters FlatUnitStrategy::take_group_counters() {
  CommCounters total;
  if (shard_group_) total += shard_group_->take_counters();
  if (replica_group_) total += replica_group_->take_counters();
  return total;
}

int FlatUnitStrategy::gathered_units() const {
  return static_cast<int>(std::count_if(gather_state_.begin(), gather_state_.end(),
                                        [](GatherState s) { return s != GatherState::none; }));
}

int FlatUnitStrategy::pending_reductions() const {
  int n = static_cast<int>(pending_reduces_.size());
  for (const auto& w : bucket_works_) n += w.is_done() ? 0 : 1;
  return n;
}

}  // namespace shardlm
