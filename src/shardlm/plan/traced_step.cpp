#include "shardlm/plan/traced_step.hpp"

#include <memory>
#include <optional>
#include <string>

#include "shardlm/backend/meta/meta_backend.hpp"
#include "shardlm/comm/recording_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/parallel/host_owned_state.hpp"
#include "shardlm/parallel/mesh.hpp"
#include "shardlm/parallel/placed_mesh.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

namespace {

// Scalars the trainer and the norm all-reduce (a double or an int64 each).
constexpr uint64_t kScalarBytes = 8;

// The run's model, its forward and backward of each unit counted in the recording
// as that unit's UnitWork instead of what its kernels recorded, placed where they ran
// between the unit's own collectives (StepRecording::end_span): the overlap of a
// tensor-parallel input gradient's reduction with the weight-gradient GEMM is in the
// program as the backward runs it.
class UnitWorkModel final : public Model {
 public:
  UnitWorkModel(Model& model, StepRecording& recording, const std::vector<UnitWork>& work)
      : model_(model), recording_(recording), work_(work) {
    SHARDLM_CHECK(work.size() == static_cast<size_t>(model.num_units()),
                  "internal: unit work for {} model units, the model has {}", work.size(),
                  model.num_units());
  }
  const ModelConfig& config() const override { return model_.config(); }
  const ParamLayout& layout() const override { return model_.layout(); }
  const ModelOptions& options() const override { return model_.options(); }
  int num_units() const override { return model_.num_units(); }
  std::vector<int> units_needed_for(int unit) const override { return model_.units_needed_for(unit); }
  int logits_chunk_rows() const override { return model_.logits_chunk_rows(); }
  void forward_unit(int unit, ParamPointers params, UnitPointers grads, const MicroBatch& batch,
                    bool training, float grad_scale) override {
    const size_t span = recording_.begin_span();
    model_.forward_unit(unit, params, grads, batch, training, grad_scale);
    recording_.end_span(span, work_[static_cast<size_t>(unit)].forward, fmt::format("forward unit {}", unit));
  }
  void backward_unit(int unit, ParamPointers params, UnitPointers grads,
                     const MicroBatch& batch) override {
    const size_t span = recording_.begin_span();
    model_.backward_unit(unit, params, grads, batch);
    recording_.end_span(span, work_[static_cast<size_t>(unit)].backward, fmt::format("backward unit {}", unit));
  }
  double last_loss_sum() const override { return model_.last_loss_sum(); }
  int64_t last_target_count() const override { return model_.last_target_count(); }
  void logits_at(ParamPointers params, int t, float* out) const override {
    model_.logits_at(params, t, out);
  }
  KvCache make_kv_cache(int capacity) const override { return model_.make_kv_cache(capacity); }
  void forward_unit_cached(int unit, ParamPointers params, KvCache& cache,
                           const MicroBatch& batch) override {
    model_.forward_unit_cached(unit, params, cache, batch);
  }

 private:
  Model& model_;
  StepRecording& recording_;
  const std::vector<UnitWork>& work_;
};

// How the mesh's groups name the expert ones: none, the expert dimension, or the expert
// group spanning the context ranks (whose experts' partition is shard alone).
enum class ExpertLayout { none, expert_dimension, spanning_context };

ExpertLayout expert_layout(const MeshShape& shape) {
  if (shape.expert_parallel_size() <= 1) return ExpertLayout::none;
  return shape.expert_spans_context() ? ExpertLayout::spanning_context : ExpertLayout::expert_dimension;
}

CommGroup comm_group(const std::string& communicator, ExpertLayout experts, bool tensor_is_world) {
  // A tensor dimension spanning the world is the world communicator itself (the mesh
  // splits no group for it); everything else then runs on one rank or is a scalar.
  if (tensor_is_world && (communicator == "world" || communicator == "world.kv_replicas"))
    return CommGroup::tensor;
  // Hybrid context attention's Ulysses groups and rings (model/context_parallel/
  // hybrid_attention.hpp) are placed with the context group they split (the time model
  // does not tell the U consecutive ranks from the ring's ranks U apart).
  for (const std::string suffix : {".ulysses", ".ring"})
    if (communicator.size() > suffix.size() && communicator.ends_with(suffix))
      return comm_group(communicator.substr(0, communicator.size() - suffix.size()), experts,
                        tensor_is_world);
  if (communicator == "world") return CommGroup::world;
  if (communicator == "expert group" || communicator == "expert x context group")
    return CommGroup::expert;
  // The partition (consecutive ranks): shard, or shard x context; under expert
  // parallelism these are the experts' (shard x context outside the expert ranks, shard
  // alone when the expert group spans the context ranks; the dense units' partition is
  // the world, or with hybrid its shard group's ranks).
  if (communicator == "shard group")
    return experts == ExpertLayout::none ? CommGroup::shard : CommGroup::expert_data;
  if (communicator == "shard x context group")
    return experts == ExpertLayout::expert_dimension ? CommGroup::expert_data : CommGroup::shard;
  if (communicator == "shard x expert group" || communicator == "shard x expert x context group")
    return CommGroup::shard;
  if (communicator == "replica group") return CommGroup::replica;
  if (communicator == "context group") return CommGroup::context;
  // The tensor group and its key/value-head replica groups (runs of consecutive ranks
  // inside it: model/tensor_parallel/tensor_parallel_block.hpp).
  if (communicator == "tensor group" || communicator == "tensor group.kv_replicas")
    return CommGroup::tensor;
  throw Error(fmt::format("internal: the plan's time model has no place for communicator '{}'",
                          communicator));
}

StepProgram program_of(const StepRecording& recording, size_t scratch_bytes, ExpertLayout experts,
                       bool tensor_is_world) {
  StepProgram program;
  for (const RecordedCollective& c : recording.collectives())
    program.collectives.push_back(
        {c.kind, comm_group(c.group, experts, tensor_is_world), static_cast<double>(c.bus_bytes),
         collective_messages(c.kind, static_cast<double>(c.bytes), c.group_size, scratch_bytes,
                             c.element_bytes),
         c.label});
  for (const RecordedOp& op : recording.ops()) {
    StepOp out;
    out.collective = op.collective;
    out.label = op.label;
    switch (op.kind) {
      case RecordedOp::Kind::compute:
        out.kind = StepOp::Kind::compute;
        out.work = op.work;
        break;
      case RecordedOp::Kind::issue: out.kind = StepOp::Kind::issue; break;
      case RecordedOp::Kind::wait: out.kind = StepOp::Kind::wait; break;
      case RecordedOp::Kind::step_end: out.kind = StepOp::Kind::step_end; break;
    }
    program.ops.push_back(std::move(out));
  }
  return program;
}

TracedStep::Peaks peaks_of(const MemoryTracker& tracker) {
  TracedStep::Peaks out{};
  for (int c = 0; c < MemoryTracker::kNumCategories; ++c)
    out[static_cast<size_t>(c)] = static_cast<int64_t>(tracker.peak(static_cast<MemCategory>(c)));
  return out;
}

}  // namespace

TracedStep trace_step(const RunPlanRequest& r, int steps, const std::vector<UnitWork>& unit_work) {
  SHARDLM_CHECK(steps >= 1, "internal: a traced step needs at least one step");
  const int n = r.world_size;
  const bool on_device = !r.model.device.is_host();
  // The device's meta backend, and the host's for a device run (else the same one).
  meta::MetaBackend device(r.model.device);
  std::optional<meta::MetaBackend> host_backend;
  if (on_device) host_backend.emplace(Device{});
  meta::MetaBackend& host = on_device ? *host_backend : device;

  const MeshShape shape = plan_mesh(r);
  const std::vector<MeshDims> groups = run_mesh_groups(shape);
  // DeviceMesh splits each group that does not span the world, in this order; then the
  // model's tensor-parallel layers split the tensor group into the ranks that hold the
  // same key/value head when there are fewer of those than tensor ranks.
  std::vector<int> split_sizes;
  for (const MeshDims& dims : groups)
    if (shape.size(dims) != n) split_sizes.push_back(shape.size(dims));
  // Then the model's own splits, in the order it makes them: hybrid context attention's
  // Ulysses groups and ring (before the tensor block's key/value replicas).
  const int P = shape.size(MeshDim::context);
  if (P > 1 && r.model.context_parallel_kind == ContextParallelKind::hybrid) {
    split_sizes.push_back(r.model.ulysses_degree);
    split_sizes.push_back(P / r.model.ulysses_degree);
  }
  const int T = shape.size(MeshDim::tensor);
  if (T > 1 && r.config.kv_heads() % T != 0) split_sizes.push_back(T / r.config.kv_heads());

  StepRecording recording;
  recording.add_compute_source(device);
  recording.add_compute_source(host);
  CommOptions comm_options;
  comm_options.scratch_bytes = r.comm_scratch_bytes;
  TracedStep out;
  {
    RecordingCommunicator world(n, recording, split_sizes, host, comm_options);
    const int partition = partition_size(shape);
    // The planned rank is tensor coordinate 0: every tensor rank's pieces are as large.
    const ParamLayout layout =
        ParamLayout::build(r.config, partition, r.min_unit_params, TensorSplit{T, 0});
    DeviceMesh mesh(shape, world, groups);
    ModelOptions model_options = r.model;
    model_options.backend = &device;
    model_options.parallel_groups = model_parallel_groups(mesh);
    const std::unique_ptr<Model> run_model =
        model_family(r.config.family)
            .make_model(r.config, layout, r.micro_batch, r.seq_len, model_options, host.tracker());
    UnitWorkModel model(*run_model, recording, unit_work);
    FlatUnitStrategy strategy(layout, model.unit_needs(), mesh, r.strategy, host.tracker(), device);
    std::unique_ptr<HostOwnedState> host_state;
    if (on_device)
      host_state = std::make_unique<HostOwnedState>(
          layout, strategy, device,
          r.strategy.optimizer_on_host ? HostOwnedState::Role::offloaded_optimizer
                                       : HostOwnedState::Role::mirror,
          host);
    if (r.strategy.optimizer_on_host) strategy.accumulate_gradients_on(*host_state);
    AdamWOptimizer optimizer(layout, strategy, AdamWConfig{}, device,
                             r.strategy.optimizer_on_host ? host_state.get() : nullptr);
    ModelRunner runner(model, strategy);
    // Initialised state made consistent, as the trainer does after init or a load.
    if (host_state)
      host_state->after_load();
    else
      strategy.after_load();
    strategy.synchronize();
    recording.clear();

    const int global_batch =
        r.global_batch > 0 ? r.global_batch : r.micro_batch * shape.data_parallel_size();
    const int accumulation =
        BatchPartition(global_batch, shape.data_parallel_size(), r.micro_batch).accumulation_steps();
    // The rows' contents do not matter on the meta device (nothing is computed); the
    // model only checks them.
    const size_t tokens = static_cast<size_t>(r.micro_batch) * static_cast<size_t>(r.seq_len);
    const std::vector<int32_t> ids(tokens, 0);
    const MicroBatch batch{ids.data(), ids.data(), r.micro_batch, r.seq_len, nullptr, nullptr};
    for (int step = 0; step < steps; ++step) {
      // The trainer's step (train/trainer.cpp, Trainer::train_step), in its order.
      int64_t target_count[1] = {static_cast<int64_t>(tokens) * accumulation};
      world.all_reduce_blocking(std::span<int64_t>(target_count, 1), ReduceOp::sum, "target count");
      strategy.begin_step(accumulation);
      double loss_sum = 0.0;
      const float grad_scale = 1.0f / static_cast<float>(target_count[0]);
      for (int k = 0; k < accumulation; ++k) {
        loss_sum += runner.forward(batch, /*training=*/true, grad_scale);
        runner.backward(batch, k);
      }
      strategy.finish_gradients();
      world.all_reduce_blocking(std::span<double>(&loss_sum, 1), ReduceOp::sum, "loss sum");
      strategy.global_grad_norm_squared();
      optimizer.step(1e-4f, 1.0f, step + 1);
      strategy.after_step();
      recording.end_step();
    }
    strategy.synchronize();  // the last step's parameter all-gathers (zero1/zero2)
    out.device = peaks_of(device.tracker());
    if (on_device) out.host = peaks_of(host.tracker());
  }
  out.program = program_of(recording, r.comm_scratch_bytes, expert_layout(shape), T > 1 && T == n);
  // The last step: after the next-to-last step_end.
  const auto& ops = recording.ops();
  size_t first = 0;
  for (size_t i = 0, ends = 0; i + 1 < ops.size(); ++i)
    if (ops[i].kind == RecordedOp::Kind::step_end && ++ends == static_cast<size_t>(steps - 1))
      first = i + 1;
  for (size_t i = first; i < ops.size(); ++i)
    if (ops[i].kind == RecordedOp::Kind::issue) {
      const RecordedCollective& c = recording.collectives()[static_cast<size_t>(ops[i].collective)];
      if (c.bytes > kScalarBytes) out.wire_bytes_per_step += static_cast<double>(c.bus_bytes);
    }
  return out;
}

}  // namespace shardlm
