#include "shardlm/plan/traced_step.hpp"

#include <memory>
#include <optional>

#include "shardlm/backend/meta/meta_backend.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/parallel/host_owned_state.hpp"
#include "shardlm/parallel/mesh.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

namespace {

// Scalars the trainer and the norm all-reduce (a double or an int64 each).
constexpr uint64_t kScalarBytes = 8;

TracedStep::Peaks peaks_of(const MemoryTracker& tracker) {
  TracedStep::Peaks out{};
  for (int c = 0; c < MemoryTracker::kNumCategories; ++c)
    out[static_cast<size_t>(c)] = static_cast<int64_t>(tracker.peak(static_cast<MemCategory>(c)));
  return out;
}

}  // namespace

TracedStep trace_step(const RunPlanRequest& r, int steps) {
  SHARDLM_CHECK(steps >= 1, "internal: a traced step needs at least one step");
  const int n = r.world_size;
  const bool on_device = !r.model.device.is_host();
  // The device's meta backend, and the host's for a device run (else the same one).
  meta::MetaBackend device(r.model.device);
  std::optional<meta::MetaBackend> host_backend;
  if (on_device) host_backend.emplace(Device{});
  meta::MetaBackend& host = on_device ? *host_backend : device;

  const MeshShape shape = strategy_mesh(r.strategy, n);
  const std::vector<MeshDims> groups = FlatUnitStrategy::mesh_groups(shape);
  // DeviceMesh splits each group that does not span the world, in this order.
  std::vector<int> split_sizes;
  for (const MeshDims& dims : groups)
    if (shape.size(dims) != n) split_sizes.push_back(shape.size(dims));

  StepRecording recording;
  recording.add_compute_source(device);
  recording.add_compute_source(host);
  CommOptions comm_options;
  comm_options.scratch_bytes = r.comm_scratch_bytes;
  TracedStep out;
  {
    RecordingCommunicator world(n, recording, split_sizes, host, comm_options);
    const int partition = shape.size(MeshDim::shard);
    const ParamLayout layout = ParamLayout::build(r.config, partition, r.min_unit_params);
    ModelOptions model_options = r.model;
    model_options.backend = &device;
    const std::unique_ptr<Model> model =
        model_family(r.config.family)
            .make_model(r.config, layout, r.micro_batch, r.seq_len, model_options, host.tracker());
    DeviceMesh mesh(shape, world, groups);
    FlatUnitStrategy strategy(layout, model->unit_needs(), mesh, r.strategy, host.tracker(), device);
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
    ModelRunner runner(*model, strategy);
    // Initialised state made consistent, as the trainer does after init or a load.
    if (host_state)
      host_state->after_load();
    else
      strategy.after_load();
    strategy.synchronize();
    recording.clear();

    const int global_batch = r.global_batch > 0 ? r.global_batch : r.micro_batch * n;
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
  out.collectives = recording.collectives();
  out.ops = recording.ops();
  // The last step: after the next-to-last step_end.
  size_t first = 0;
  for (size_t i = 0, ends = 0; i + 1 < out.ops.size(); ++i)
    if (out.ops[i].kind == RecordedOp::Kind::step_end && ++ends == static_cast<size_t>(steps - 1))
      first = i + 1;
  for (size_t i = first; i < out.ops.size(); ++i)
    if (out.ops[i].kind == RecordedOp::Kind::issue) {
      const RecordedCollective& c = out.collectives[static_cast<size_t>(out.ops[i].collective)];
      if (c.bytes > kScalarBytes) out.wire_bytes_per_step += static_cast<double>(c.bus_bytes);
    }
  return out;
}

RunPlan plan_run_traced(const RunPlanRequest& request) {
  RunPlan plan = plan_run(request);
  const TracedStep t = trace_step(request, 2);
  plan.params = t.device_peak(MemCategory::params);
  plan.grads = t.device_peak(MemCategory::grads);
  plan.optimizer = t.device_peak(MemCategory::optimizer);
  plan.activations = t.device_peak(MemCategory::activations);
  plan.comm = t.device_peak(MemCategory::comm);
  plan.frozen = t.device_peak(MemCategory::frozen);
  plan.host.params = t.host_peak(MemCategory::params);
  plan.host.grads = t.host_peak(MemCategory::grads);
  plan.host.optimizer = t.host_peak(MemCategory::optimizer);
  plan.host.frozen = t.host_peak(MemCategory::frozen);
  plan.host.comm = t.host_peak(MemCategory::comm);
  plan.wire_bytes_per_step = t.wire_bytes_per_step;
  return plan;
}

}  // namespace shardlm
