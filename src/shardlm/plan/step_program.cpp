#include "shardlm/plan/step_program.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include "shardlm/comm/mpi_algorithms.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

namespace shardlm {

double collective_messages(CollectiveKind kind, double bytes, int n, size_t scratch_bytes,
                           size_t element_bytes) {
  if (n <= 1) return 0;
  const double peers = n - 1;
  const auto reduce_scatter_rounds = [&](double elements_per_rank) {
    const double floats = static_cast<double>(scratch_bytes) / 4;
    const double slots = element_bytes == 2 ? 2 * floats / (2 * n - 1) : floats / (n - 1);
    const double chunk = std::max(1.0, std::min(elements_per_rank, std::floor(slots)));
    return std::max(1.0, std::ceil(elements_per_rank / chunk));
  };
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::broadcast:
      return peers;
    case CollectiveKind::reduce_scatter:
      return peers * reduce_scatter_rounds(bytes / static_cast<double>(element_bytes) / n);
    case CollectiveKind::all_reduce:
      if (bytes * n <= static_cast<double>(mpi::kSmallAllReduceBytes)) return peers;
      return peers * reduce_scatter_rounds(bytes / 4 / n) + peers;
    default:
      return 0;
  }
}

double adamw_state_bytes(double owned, bool writes_bf16_copy) {
  return (28 + (writes_bf16_copy ? 2 : 0)) * owned;
}

namespace {

class ProgramBuilder {
 public:
  explicit ProgramBuilder(const StepShape& s)
      : s_(s),
        U_(s.unit_numel.size()),
        M_(static_cast<int>(s.flat_unit_of.size())),
        shard_params_(s.strategy.kind == StrategyKind::zero3 ||
                      s.strategy.kind == StrategyKind::hybrid),
        // Offloaded (--offload optimizer), every strategy reduces unit by unit as zero2.
        shard_grads_(s.strategy.kind == StrategyKind::zero2 || shard_params_ ||
                     s.strategy.optimizer_on_host),
        replica_size_(s.world_size / s.partition),
        schedule_(FlatUnitStrategy::training_schedule(M_)),
        gather_(U_, -1),
        ready_(U_, false),
        grad_held_(U_, false),
        param_sync_(U_, -1),
        stale_(U_, true),
        first_model_unit_(U_, -1),
        free_params_(s.param_pool),
        free_grads_(s.grad_pool) {
    SHARDLM_CHECK(s.work.size() == static_cast<size_t>(M_) && s.flat_needs.size() == s.work.size(),
                  "internal: step shape has {} model units, {} work entries, {} need lists", M_,
                  s.work.size(), s.flat_needs.size());
    for (int m = M_ - 1; m >= 0; --m) first_model_unit_[unit(m)] = m;
  }

  void step() {
    blocking_all_reduce(CommGroup::world, "target count");
    compute(state(zeroed_gradient_bytes()), "zero gradients");
    for (int k = 0; k < s_.accumulation; ++k) {
      for (int m = 0; m < M_; ++m) forward(m);
      for (int m = M_ - 1; m >= 0; --m) backward(m, k);
    }
    finish_gradients();
    blocking_all_reduce(CommGroup::world, "loss sum");
    compute(state(gradient_norm_bytes()), "gradient norm");
    blocking_all_reduce(CommGroup::shard, "grad norm");
    compute(adamw(), "adamw");
    after_step();
    program_.ops.push_back({StepOp::Kind::step_end, {}, -1, ""});
  }

  StepProgram take() { return std::move(program_); }

 private:
  size_t unit(int model_unit) const {
    return static_cast<size_t>(s_.flat_unit_of[static_cast<size_t>(model_unit)]);
  }
  double numel(size_t u) const { return static_cast<double>(s_.unit_numel[u]); }
  double shard(size_t u) const { return numel(u) / s_.partition; }
  static ComputeWork state(double bytes) {
    ComputeWork w;
    w.state_bytes = bytes;
    return w;
  }

  // The per-step state work (FlatUnit's): only trainable units have gradients and
  // optimizer state, so a frozen unit (LoRA's base) adds nothing to any of it.
  // begin_step zeroes each trainable unit's reduced gradient (the owned slice when
  // gradients are sharded, else the whole unit).
  double zeroed_gradient_bytes() const {
    double elements = 0;
    for (size_t u = 0; u < U_; ++u)
      if (trains(u)) elements += shard_grads_ ? shard(u) : numel(u);
    return 4 * elements;
  }
  // The norm sums the squares of each trainable unit's reduced slice (every strategy
  // reads 1/partition of the unit; the shard group all-reduces the sum).
  double gradient_norm_bytes() const {
    double elements = 0;
    for (size_t u = 0; u < U_; ++u)
      if (trains(u)) elements += shard(u);
    return 4 * elements;
  }
  // AdamW over the owned trainable elements: the whole unit under ddp, a slice else.
  ComputeWork adamw() const {
    double owned = 0;
    for (size_t u = 0; u < U_; ++u)
      if (trains(u)) owned += s_.strategy.kind == StrategyKind::ddp ? numel(u) : shard(u);
    const bool ddp_copy = s_.strategy.kind == StrategyKind::ddp && s_.compute_copy;
    ComputeWork w;
    w.optimizer_bytes = adamw_state_bytes(owned, ddp_copy);
    return w;
  }
  int group_size(CommGroup g) const {
    return g == CommGroup::world ? s_.world_size
                                 : g == CommGroup::shard ? s_.partition : replica_size_;
  }

  int issue(CollectiveKind kind, CommGroup group, double bytes, size_t element_bytes,
            std::string label) {
    const int n = group_size(group);
    PlannedCollective c;
    c.kind = kind;
    c.group = group;
    c.bus_bytes = static_cast<double>(bus_bytes_for(kind, static_cast<uint64_t>(bytes), n));
    c.messages = collective_messages(kind, bytes, n, s_.comm_scratch_bytes, element_bytes);
    c.label = std::move(label);
    program_.collectives.push_back(std::move(c));
    const int id = static_cast<int>(program_.collectives.size()) - 1;
    program_.ops.push_back({StepOp::Kind::issue, {}, id, ""});
    return id;
  }
  void wait(int id) { program_.ops.push_back({StepOp::Kind::wait, {}, id, ""}); }
  void compute(const ComputeWork& work, std::string label) {
    if (!work.empty()) program_.ops.push_back({StepOp::Kind::compute, work, -1, std::move(label)});
  }
  void blocking_all_reduce(CommGroup group, std::string label) {
    wait(issue(CollectiveKind::all_reduce, group, 8, 8, std::move(label)));
  }

  // ---- the hooks, as FlatUnitStrategy runs them ----
  void forward(int m) {
    const auto& needs = s_.flat_needs[static_cast<size_t>(m)];
    if (shard_params_) {
      for (int v : needs) ensure_gathered(v);
      prefetch_after(static_cast<size_t>(m));
    } else {
      for (int v : needs) refresh(v);
    }
    // The loss unit writes its head's gradient during its training forward.
    if (shard_grads_ && m == M_ - 1)
      for (int v : needs)
        if (trains(static_cast<size_t>(v))) acquire_grads(v);
    compute(s_.work[static_cast<size_t>(m)].forward, "forward");
    if (shard_params_) release_after(static_cast<size_t>(m));
  }

  void backward(int m, int micro_batch) {
    const auto& needs = s_.flat_needs[static_cast<size_t>(m)];
    const size_t cursor = static_cast<size_t>(2 * M_ - 1 - m);
    if (shard_params_) {
      for (int v : needs) ensure_gathered(v);
      prefetch_after(cursor);
    } else {
      for (int v : needs) refresh(v);
    }
    if (shard_grads_)
      for (int v : needs)
        if (trains(static_cast<size_t>(v))) acquire_grads(v);
    compute(s_.work[static_cast<size_t>(m)].backward, "backward");
    const size_t u = unit(m);
    if (first_model_unit_[u] == m && trains(u)) {  // the flat unit's gradient is complete
      if (shard_grads_) {
        int reduced = issue(CollectiveKind::reduce_scatter, CommGroup::shard,
                            numel(u) * reduce_bytes(), reduce_bytes(), "reduce_scatter grads");
        // Offloaded ddp: the host updates the whole unit, so the reduced slices are
        // all-gathered after, on the same group (FlatUnit::start_reduce).
        if (s_.strategy.optimizer_on_host && s_.strategy.kind == StrategyKind::ddp)
          reduced = issue(CollectiveKind::all_gather, CommGroup::shard, numel(u) * 4, 4,
                          "all_gather grads");
        pending_.push_back({static_cast<int>(u), reduced});
      } else if (micro_batch == s_.accumulation - 1) {
        for (size_t b = 0; b < s_.buckets.size(); ++b)
          if (s_.buckets[b].back() == static_cast<int>(u)) launch_bucket(b);
      }
    }
    if (shard_params_) release_after(cursor);
  }

  size_t reduce_bytes() const { return s_.strategy.reduce_dtype == DType::bf16 ? 2 : 4; }
  bool trains(size_t u) const { return s_.trainable.empty() || s_.trainable[u]; }
  size_t param_bytes() const { return dtype_bytes(s_.param_type); }
  bool raw(size_t u) const { return !s_.raw.empty() && s_.raw[u]; }
  size_t unit_param_bytes(size_t u) const { return raw(u) ? 4 : param_bytes(); }

  void launch_bucket(size_t b) {
    for (int v : s_.buckets[b]) {
      const size_t u = static_cast<size_t>(v);
      bucket_works_.push_back(issue(CollectiveKind::reduce_scatter, CommGroup::shard,
                                    numel(u) * reduce_bytes(), reduce_bytes(), "reduce_scatter grads"));
      if (s_.strategy.kind == StrategyKind::ddp)
        bucket_works_.push_back(
            issue(CollectiveKind::all_gather, CommGroup::shard, numel(u) * 4, 4, "all_gather grads"));
    }
  }

  void finish_gradients() {
    for (int id : bucket_works_) wait(id);
    bucket_works_.clear();
    while (!pending_.empty()) consume_oldest();
  }

  void after_step() {
    if (s_.strategy.kind != StrategyKind::ddp)
      for (size_t u = 0; u < U_; ++u) stale_[u] = stale_[u] || trains(u);
    if (s_.strategy.kind == StrategyKind::zero1 || s_.strategy.kind == StrategyKind::zero2)
      for (size_t u = 0; u < U_; ++u)
        if (trains(u)) {
          // Offloaded, the device stores the parameters in the compute type only.
          const size_t bytes = s_.strategy.optimizer_on_host ? param_bytes() : 4;
          param_sync_[u] = issue(CollectiveKind::all_gather, CommGroup::shard, numel(u) * bytes,
                                 bytes, "all_gather params");
        }
  }

  // Replicated parameters: wait for the unit's all-gather, round the bf16 copy.
  void refresh(int v) {
    const size_t u = static_cast<size_t>(v);
    if (param_sync_[u] >= 0) wait(param_sync_[u]);
    param_sync_[u] = -1;
    // Frozen units are stored in the compute type: nothing to round.
    if (!s_.compute_copy || raw(u) || !trains(u) || !stale_[u]) return;
    compute(state(numel(u) * (4 + param_bytes())), "round parameters");
    stale_[u] = false;
  }

  // zero3/hybrid gathering (FlatUnitStrategy::ensure_gathered and friends).
  void start_gather(int v) {
    const size_t u = static_cast<size_t>(v);
    if (!s_.shared_unit[u]) --free_params_;
    // A frozen unit's shard is already stored in the type gathered.
    if (unit_param_bytes(u) != 4 && trains(u))
      compute(state(shard(u) * (4 + param_bytes())), "round shard");
    gather_[u] = issue(CollectiveKind::all_gather, CommGroup::shard, numel(u) * unit_param_bytes(u),
                       unit_param_bytes(u), "all_gather params");
    ready_[u] = false;
  }
  void ensure_gathered(int v) {
    const size_t u = static_cast<size_t>(v);
    if (gather_[u] < 0) start_gather(v);
    if (!ready_[u]) wait(gather_[u]);
    ready_[u] = true;
  }
  void release(int v) {
    const size_t u = static_cast<size_t>(v);
    if (gather_[u] < 0) return;
    if (!ready_[u]) wait(gather_[u]);
    if (!s_.shared_unit[u]) ++free_params_;
    gather_[u] = -1;
    ready_[u] = false;
  }
  void prefetch_after(size_t cursor) {
    int issued = 0;
    for (size_t s = cursor + 1; s < schedule_.size() && issued < s_.strategy.prefetch; ++s)
      for (int v : s_.flat_needs[static_cast<size_t>(schedule_[s].model_unit)]) {
        if (gather_[static_cast<size_t>(v)] >= 0) continue;
        if (!s_.shared_unit[static_cast<size_t>(v)] && free_params_ == 0) return;
        start_gather(v);
        if (++issued == s_.strategy.prefetch) return;
      }
  }
  void release_after(size_t cursor) {
    const int m = schedule_[cursor].model_unit;
    for (int v : s_.flat_needs[static_cast<size_t>(m)])
      if (!FlatUnitStrategy::keeps_gathered(schedule_, s_.flat_needs, cursor, v,
                                            !s_.strategy.reshard_after_forward))
        release(v);
  }

  // zero2/zero3 gradient buffers (FlatUnitStrategy::acquire_grads, consume_oldest_reduce).
  void acquire_grads(int v) {
    const size_t u = static_cast<size_t>(v);
    const auto in_flight = [&] {
      return std::any_of(pending_.begin(), pending_.end(),
                         [&](const Pending& p) { return p.unit == v; });
    };
    while (in_flight()) consume_oldest();
    if (grad_held_[u]) return;
    if (!s_.shared_unit[u]) {
      while (free_grads_ == 0 && !pending_.empty()) consume_oldest();
      --free_grads_;
    }
    compute(state(4 * numel(u)), "zero gradient buffer");
    grad_held_[u] = true;
  }
  void consume_oldest() {
    const Pending p = pending_.front();
    pending_.pop_front();
    wait(p.collective);
    const size_t u = static_cast<size_t>(p.unit);
    if (replica_size_ > 1)
      wait(issue(CollectiveKind::all_reduce, CommGroup::replica, shard(u) * 4, 4,
                 "all_reduce grads across replicas"));
    compute(state(12 * shard(u)), "accumulate reduced gradient");
    if (!s_.shared_unit[u]) ++free_grads_;
    grad_held_[u] = false;
  }

  struct Pending {
    int unit;
    int collective;
  };
  const StepShape& s_;
  const size_t U_;
  const int M_;
  const bool shard_params_, shard_grads_;
  const int replica_size_;
  const std::vector<FlatUnitStrategy::Step> schedule_;
  std::vector<int> gather_;  // collective id of the unit's gather, -1 when not gathered
  std::vector<bool> ready_;
  std::vector<bool> grad_held_;
  std::vector<int> param_sync_;  // zero1/zero2: pending all-gather of updated params
  std::vector<bool> stale_;      // bf16 copy older than the fp32 parameters
  std::vector<int> first_model_unit_;
  int free_params_, free_grads_;
  std::deque<Pending> pending_;
  std::vector<int> bucket_works_;
  StepProgram program_;
};

}  // namespace

StepProgram build_step_program(const StepShape& shape, int steps) {
  SHARDLM_CHECK(steps >= 1, "internal: a step program needs at least one step");
  ProgramBuilder builder(shape);
  for (int i = 0; i < steps; ++i) builder.step();
  return builder.take();
}

}  // namespace shardlm
