#include "shardlm/plan/run_plan.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/parallel/strategy_options.hpp"
#include "shardlm/plan/traced_step.hpp"
#include "shardlm/plan/unit_work.hpp"

namespace shardlm {

MeshShape plan_mesh(const RunPlanRequest& r) { return strategy_mesh(r.strategy, r.world_size); }

RunPlan plan_run(const RunPlanRequest& r) {
  RunPlan plan;
  const int n = r.world_size;
  const MeshShape mesh = plan_mesh(r);
  plan.world_size = n;
  plan.partition = partition_size(mesh);
  plan.expert_parallel = r.strategy.expert_parallel;
  plan.expert_spans_context = mesh.expert_spans_context();
  plan.context_parallel = r.strategy.context_parallel;
  plan.tensor_parallel = r.strategy.tensor_parallel;
  // Default: a micro-batch per data-parallel rank (context ranks share their rows).
  const int global_batch = r.global_batch > 0 ? r.global_batch : r.micro_batch * mesh.data_parallel_size();
  plan.accumulation =
      BatchPartition(global_batch, mesh.data_parallel_size(), r.micro_batch).accumulation_steps();
  plan.device = r.model.device;
  plan.precision = r.model.precision;

  const ParamLayout layout = ParamLayout::build(r.config, plan.partition, r.min_unit_params);
  // Parameters as values: a QLoRA base weight counts its values, not its storage words.
  for (const auto& u : layout.units) {
    plan.parameters += u.padded_numel;
    for (const auto& p : u.params) plan.parameters += p.logical_numel() - p.numel;
  }
  const ModelFamily& family = model_family(r.config.family);
  const double flops_per_token = r.config.train_flops_per_token(r.seq_len);
  plan.flops_per_step = flops_per_token * static_cast<double>(global_batch) / n * r.seq_len;
  plan.tokens_per_step = static_cast<double>(global_batch) * r.seq_len;
  // Tensor parallelism: the planned rank (tensor coordinate 0; every one does as much)
  // multiplies its pieces of the split matrices (the vocabulary-parallel head's too),
  // its H/T heads' attention, and the whole (replicated) norms.
  plan.unit_work = model_unit_work(r.config, family.model_units(r.config),
                                   family.unit_needs(r.config), flops_per_token, r.micro_batch,
                                   r.seq_len, r.model, TensorSplit{r.strategy.tensor_parallel, 0});
  // Expert parallelism: the planned rank (expert coordinate 0) runs its E/ep experts
  // over the tokens of its ep group's ranks, and none of the others.
  if (const int E = r.strategy.expert_parallel; E > 1) {
    const std::vector<UnitLayout> units = family.model_units(r.config);
    for (size_t m = 0; m < units.size(); ++m) {
      const int holder = FlatUnitStrategy::expert_holder(units[m], E);
      if (holder < 0) continue;
      UnitWork& w = plan.unit_work[m];
      w = holder == 0 ? UnitWork{w.forward * E, w.backward * E} : UnitWork{};
    }
  }

  // Context parallelism: a rank computes T/P of every row's tokens (Ulysses runs the
  // attention over whole rows for H/P heads), 1/P of a micro-batch's work.
  if (const int P = r.strategy.context_parallel; P > 1)
    for (UnitWork& w : plan.unit_work)
      w = UnitWork{w.forward * (1.0 / P), w.backward * (1.0 / P)};
  TracedStep traced = trace_step(r, kPlannedSteps, plan.unit_work);
  const auto device = [&](MemCategory c) { return traced.device_peak(c); };
  const auto host = [&](MemCategory c) { return traced.host_peak(c); };
  plan.params = device(MemCategory::params);
  plan.grads = device(MemCategory::grads);
  plan.optimizer = device(MemCategory::optimizer);
  plan.activations = device(MemCategory::activations);
  plan.comm = device(MemCategory::comm);
  plan.frozen = device(MemCategory::frozen);
  plan.host = {host(MemCategory::params), host(MemCategory::grads), host(MemCategory::optimizer),
               host(MemCategory::frozen), host(MemCategory::comm)};
  plan.wire_bytes_per_step = traced.wire_bytes_per_step;
  plan.program = std::move(traced.program);
  return plan;
}

GroupTraffic last_step_traffic(const RunPlan& plan, CommGroup group) {
  const auto& ops = plan.program.ops;
  size_t first = 0;
  for (size_t i = 0, ends = 0; i < ops.size(); ++i)
    if (ops[i].kind == StepOp::Kind::step_end && ++ends == kPlannedSteps - 1) first = i + 1;
  GroupTraffic out;
  for (size_t i = first; i < ops.size(); ++i) {
    if (ops[i].kind != StepOp::Kind::issue) continue;
    const PlannedCollective& c = plan.program.collectives[static_cast<size_t>(ops[i].collective)];
    if (c.group != group || c.bus_bytes < 2 * 8) continue;  // a scalar's bus bytes are fewer
    out.calls += 1;
    out.bus_bytes += c.bus_bytes;
  }
  return out;
}

}  // namespace shardlm
