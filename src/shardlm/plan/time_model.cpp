#include "shardlm/plan/time_model.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/plan/step_simulation.hpp"

namespace shardlm {

namespace {

// A group of `size` ranks `stride` apart (its ranks r, r + stride, ...), ranks placed
// consecutively on nodes of ranks_per_node: on one node when its span fits a node;
// otherwise across nodes, each node's link carrying one ring for every group with
// members on the node (min(stride, ranks_per_node) of them).
GroupPlacement place_strided(int stride, int size, int ranks_per_node) {
  if (size <= 1) return {true, 1};
  const int span = stride * size;
  if (span <= ranks_per_node && ranks_per_node % span == 0) return {true, 1};
  return {false, std::max(1, std::min(stride, ranks_per_node))};
}

}  // namespace

GroupPlacement place_group(CommGroup group, int world_size, int partition, int ranks_per_node,
                           int expert_parallel, int tensor_parallel, int context_parallel,
                           bool expert_spans_context) {
  if (world_size <= ranks_per_node) return {true, 1};
  // Mesh order (parallel/mesh_shape.hpp): replicate, shard, expert, context, tensor
  // (innermost): every dimension's ranks are the tensor dimension's size apart, the
  // expert dimension's the context one's times that.
  const int T = tensor_parallel, P = context_parallel;
  switch (group) {
    case CommGroup::world:
      return {false, 1};
    case CommGroup::tensor:  // T consecutive ranks
      return place_strided(1, T, ranks_per_node);
    case CommGroup::shard:    // the partition: consecutive tensor groups' ranks
    case CommGroup::context:  // inside the partition: on one node when the partition is
      return place_strided(T, partition, ranks_per_node);
    case CommGroup::replica:  // every (partition x T)-th rank
      return place_strided(partition * T, world_size / (partition * T), ranks_per_node);
    case CommGroup::expert:  // expert_parallel ranks P x T apart; spanning the context
                             // ranks, E consecutive tensor groups' ranks (E/P runs of P)
      if (expert_spans_context) return place_strided(T, expert_parallel, ranks_per_node);
      return place_strided(P * T, expert_parallel, ranks_per_node);
    case CommGroup::expert_data: {  // shard x context: runs of P consecutive tensor groups'
                                    // ranks, every (expert_parallel x P x T)-th rank of
                                    // the partition (a hybrid shard group's, not the world's);
                                    // spanning: shard alone, every (E x T)-th rank
      if (expert_spans_context)
        return place_strided(expert_parallel * T, partition / expert_parallel, ranks_per_node);
      const GroupPlacement run = place_strided(T, P, ranks_per_node);
      if (!run.within_node) return run;
      return place_strided(expert_parallel * P * T, partition / (expert_parallel * P), ranks_per_node);
    }
  }
  return {false, 1};
}

double compute_seconds(const ComputeWork& w, const ComputeRates& r) {
  return w.gemm_flops / r.gemm_flops_per_s + w.attention_flops / r.attention_flops_per_s +
         w.elementwise_bytes / r.elementwise_bytes_per_s + w.loss_bytes / r.loss_bytes_per_s +
         (w.state_bytes + w.optimizer_bytes) / r.state_bytes_per_s;
}

double collective_seconds(double bus_bytes, double messages, const CollectiveRate& rate,
                          int nic_sharing) {
  if (bus_bytes <= 0 && messages <= 0) return 0;
  return rate.latency_s * messages + bus_bytes * nic_sharing / rate.bus_bytes_per_s;
}

StepTimePrediction predict_step_time(const RunPlan& plan, const HardwareProfile& profile,
                                     const ClusterShape& cluster) {
  const int n = plan.world_size;
  SHARDLM_CHECK(cluster.nodes >= 1 && n % cluster.nodes == 0,
                "--nodes {} must divide the {} ranks (the same number of ranks on every node)",
                cluster.nodes, n);
  const int ranks_per_node = n / cluster.nodes;
  const ComputeRates& rates = profile.rates(std::string(dtype_name(plan.precision)), ranks_per_node);
  const TransportFigures inter =
      cluster.link.empty()
          ? profile.inter_node
          : link_transport(cluster.link, profile.inter_node.compute_share_during_comm);

  constexpr int kSteps = kPlannedSteps;
  const StepProgram& program = plan.program;
  std::vector<double> op_seconds(program.ops.size(), 0.0);
  for (size_t i = 0; i < program.ops.size(); ++i)
    if (program.ops[i].kind == StepOp::Kind::compute)
      op_seconds[i] = compute_seconds(program.ops[i].work, rates);

  StepTimePrediction out;
  std::vector<double> comm_seconds, shares;
  for (const PlannedCollective& c : program.collectives) {
    const GroupPlacement place = place_group(c.group, n, plan.partition, ranks_per_node,
                                               plan.expert_parallel, plan.tensor_parallel,
                                               plan.context_parallel, plan.expert_spans_context);
    const TransportFigures& t = place.within_node ? profile.intra_node : inter;
    // Across nodes the slower of the node's own transport and its link sets the pace.
    CollectiveRate rate = t.rate(c.kind);
    int sharing = place.nic_sharing;
    if (!place.within_node) {
      const CollectiveRate& own = profile.intra_node.rate(c.kind);
      if (own.bus_bytes_per_s < rate.bus_bytes_per_s / sharing) {
        rate.bus_bytes_per_s = own.bus_bytes_per_s;
        sharing = 1;
      }
      rate.latency_s = std::max(rate.latency_s, own.latency_s);
    }
    comm_seconds.push_back(collective_seconds(c.bus_bytes, c.messages, rate, sharing));
    shares.push_back(place.within_node ? profile.intra_node.compute_share_during_comm
                                       : std::min(inter.compute_share_during_comm,
                                                  profile.intra_node.compute_share_during_comm));
    if (c.bus_bytes > 0) (place.within_node ? out.intra_transport : out.inter_transport) = t.name;
  }
  const std::vector<SimulatedStep> steps =
      simulate_steps(program, op_seconds, comm_seconds, shares);
  const SimulatedStep& last = steps.back();

  // Totals of the last step's ops and collectives.
  size_t first_op = 0;
  for (size_t i = 0, ends = 0; i < program.ops.size(); ++i)
    if (program.ops[i].kind == StepOp::Kind::step_end && ++ends == kSteps - 1) first_op = i + 1;
  for (size_t i = first_op; i < program.ops.size(); ++i) {
    const StepOp& op = program.ops[i];
    if (op.kind == StepOp::Kind::compute) {
      out.gemm_s += op.work.gemm_flops / rates.gemm_flops_per_s;
      out.attention_s += op.work.attention_flops / rates.attention_flops_per_s;
      out.elementwise_s += op.work.elementwise_bytes / rates.elementwise_bytes_per_s;
      out.loss_s += op.work.loss_bytes / rates.loss_bytes_per_s;
      out.optimizer_s += op.work.optimizer_bytes / rates.state_bytes_per_s;
      out.state_s += (op.work.state_bytes + op.work.optimizer_bytes) / rates.state_bytes_per_s;
    } else if (op.kind == StepOp::Kind::issue) {
      const size_t c = static_cast<size_t>(op.collective);
      CollectiveTotals& k = out.comm[static_cast<size_t>(program.collectives[c].kind)];
      k.calls += 1;
      k.bus_bytes += program.collectives[c].bus_bytes;
      k.messages += program.collectives[c].messages;
      k.seconds += comm_seconds[c];
    }
  }
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    out.comm[static_cast<size_t>(k)].exposed_s = last.exposed_by_kind[static_cast<size_t>(k)];
    out.comm_s += out.comm[static_cast<size_t>(k)].seconds;
  }
  out.compute_s = last.compute_s;
  out.exposed_s = last.exposed_s;
  out.overlap_cost_s = last.overlap_cost_s;
  out.step_s = last.step_s;
  out.tokens_per_s = out.step_s > 0 ? plan.tokens_per_step / out.step_s : 0;
  return out;
}

}  // namespace shardlm
