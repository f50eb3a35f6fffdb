#include "shardlm/plan/run_plan.hpp"

#include <algorithm>
#include <utility>

#include "shardlm/data/sampler.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/plan/unit_work.hpp"

namespace shardlm {

RunPlan plan_run(const RunPlanRequest& r) {
  RunPlan plan;
  const int n = r.world_size;
  plan.partition = partition_size(r.strategy, n);
  const int global_batch = r.global_batch > 0 ? r.global_batch : r.micro_batch * n;
  plan.accumulation = BatchPartition(global_batch, n, r.micro_batch).accumulation_steps();

  const ParamLayout layout = ParamLayout::build(r.config, plan.partition, r.min_unit_params);
  const ModelFamily& family = model_family(r.config.family);
  const auto needs = family.unit_needs(r.config);
  const StrategyBufferPlan buffers = FlatUnitStrategy::plan_buffers(layout, needs, r.strategy);
  plan.params = buffers.params_bytes;
  plan.grads = buffers.grads_bytes;
  plan.optimizer = buffers.optimizer_bytes;
  plan.device = r.model.device;
  if (!plan.device.is_host())
    plan.host = {buffers.host_params_bytes, buffers.host_grads_bytes,
                 buffers.host_optimizer_bytes, buffers.host_frozen_bytes};
  plan.frozen = buffers.frozen_bytes;
  const bool params_in_compute_type = buffers.param_type != DType::fp32;
  const ModelMemoryPlan model =
      family.plan_memory(r.config, r.micro_batch, r.seq_len, r.model, params_in_compute_type);
  plan.activations = model.activations;
  plan.params += model.params_scratch;
  plan.comm = n > 1 ? static_cast<int64_t>(r.comm_scratch_bytes) : 0;
  if (!plan.device.is_host()) std::swap(plan.comm, plan.host.comm);  // the host's communicator
  // Parameters as values: a QLoRA base weight counts its values, not its storage words.
  for (const auto& u : layout.units) {
    plan.parameters += u.padded_numel;
    for (const auto& p : u.params) plan.parameters += p.logical_numel() - p.numel;
  }

  // Bus bytes per rank and step: each collective moves (G-1)/G of its buffer
  // (docs/communication.md, Counters).
  const double pb = static_cast<double>(dtype_bytes(buffers.param_type));
  const double rb = r.strategy.reduce_dtype == DType::bf16 ? 2.0 : 4.0;
  const double a = plan.accumulation;
  const double g = plan.partition;
  double elements_moved = 0;  // bytes, before the (G-1)/G factor
  double trainable_parameters = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const double P = static_cast<double>(layout.units[u].padded_numel);
    if (!layout.units[u].trainable) {
      // A frozen unit is never reduced nor updated: only zero3/hybrid gather it.
      // Raw (NF4) units travel as their 4-byte words.
      if (r.strategy.kind == StrategyKind::zero3 || r.strategy.kind == StrategyKind::hybrid)
        elements_moved += a * buffers.gathers_per_micro_batch[u] * (layout.units[u].raw ? 4.0 : pb) * P;
      continue;
    }
    trainable_parameters += P;
    if (r.strategy.optimizer_on_host && r.strategy.kind != StrategyKind::zero3 &&
        r.strategy.kind != StrategyKind::hybrid) {
      // Offloaded, every strategy reduces every micro-batch (ddp then all-gathers the
      // reduced gradient, fp32); zero1/zero2 gather the updated parameters as stored.
      elements_moved += r.strategy.kind == StrategyKind::ddp ? a * (rb + 4) * P : (a * rb + pb) * P;
      continue;
    }
    switch (r.strategy.kind) {
      case StrategyKind::ddp:    // reduce once per step; all-gather the reduced gradients
      case StrategyKind::zero1:  // reduce once per step; all-gather the updated parameters
        elements_moved += (rb + 4) * P;
        break;
      case StrategyKind::zero2:  // reduce every micro-batch; all-gather updated parameters
        elements_moved += (a * rb + 4) * P;
        break;
      case StrategyKind::zero3:  // gather as the schedule needs, reduce every micro-batch
      case StrategyKind::hybrid:
        elements_moved += a * (buffers.gathers_per_micro_batch[u] * pb + rb) * P;
        break;
    }
  }
  plan.wire_bytes_per_step = elements_moved * (g - 1) / g;
  if (r.strategy.kind == StrategyKind::hybrid && n > plan.partition) {
    // Owned slices all-reduced (fp32) across the replica groups every micro-batch.
    const double replicas = static_cast<double>(n) / plan.partition;
    plan.wire_bytes_per_step +=
        a * 2 * 4 * trainable_parameters / g * (replicas - 1) / replicas;
  }
  const double flops_per_token = r.config.train_flops_per_token(r.seq_len);
  plan.flops_per_step = flops_per_token * static_cast<double>(global_batch) / n * r.seq_len;
  plan.tokens_per_step = static_cast<double>(global_batch) * r.seq_len;
  plan.precision = r.model.precision;

  StepShape& step = plan.step;
  step.strategy = r.strategy;
  step.world_size = n;
  step.partition = plan.partition;
  step.accumulation = plan.accumulation;
  for (const auto& u : layout.units) {
    step.unit_numel.push_back(u.padded_numel);
    step.trainable.push_back(u.trainable);
    step.raw.push_back(u.raw);
  }
  for (const auto& m : layout.model_units) step.flat_unit_of.push_back(m.unit);
  step.flat_needs = FlatUnitStrategy::flat_needs(layout, needs);
  step.work = model_unit_work(r.config, family.model_units(r.config), needs,
                              flops_per_token, r.micro_batch, r.seq_len, r.model);
  step.shared_unit = buffers.shared_unit;
  step.param_pool = buffers.param_pool;
  step.grad_pool = buffers.grad_pool;
  if (!buffers.transient_grads) step.buckets = FlatUnitStrategy::plan_buckets(layout, r.strategy.bucket_mb);
  step.param_type = buffers.param_type;
  step.compute_copy = buffers.compute_copy;
  step.comm_scratch_bytes = r.comm_scratch_bytes;
  return plan;
}

}  // namespace shardlm
