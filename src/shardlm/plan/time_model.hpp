// Step time predicted from a RunPlan and a HardwareProfile: compute time (FLOPs and
// bytes over the profile's rates for the precision), communication time per
// collective (latency x messages + bus bytes / bandwidth, on the transport the
// collective's group crosses), and how much of it the strategy's schedule hides
// behind computation (the traced step's program, RunPlan::program, simulated by
// plan/step_simulation.hpp).
// docs/planning.md describes the model and how it compares with measurements.
#pragma once

#include <array>
#include <string>

#include "shardlm/plan/hardware_profile.hpp"
#include "shardlm/plan/step_program.hpp"

namespace shardlm {

struct RunPlan;

// How the ranks sit on machines: nodes x ranks_per_node = world size, ranks placed
// consecutively (rank r on node r / ranks_per_node); `link` (link_names()), when set,
// replaces the profile's inter-node transport.
struct ClusterShape {
  int nodes = 1;
  std::string link;
};

// Where a collective group's ranks sit: within one node, or across nodes with
// `nic_sharing` groups of this kind sending through each node's link at once. The
// tensor group is innermost (consecutive ranks: inside a node when T divides a node's
// ranks); the other groups' ranks are T apart. expert_spans_context: the expert group is
// expert x context (MeshShape::expert_spans_context), E consecutive tensor groups' ranks.
struct GroupPlacement {
  bool within_node = true;
  int nic_sharing = 1;
};
GroupPlacement place_group(CommGroup group, int world_size, int partition, int ranks_per_node,
                           int expert_parallel = 1, int tensor_parallel = 1,
                           int context_parallel = 1, bool expert_spans_context = false);

// Seconds of `work` at `rates`: each FLOP or byte count over its rate, summed.
double compute_seconds(const ComputeWork& work, const ComputeRates& rates);
// latency x messages + bus bytes / (bandwidth / nic_sharing).
double collective_seconds(double bus_bytes, double messages, const CollectiveRate& rate,
                          int nic_sharing);

struct CollectiveTotals {
  int64_t calls = 0;
  double bus_bytes = 0, messages = 0, seconds = 0, exposed_s = 0;
};

struct StepTimePrediction {
  // Compute per step at full speed, by kind of work. state_s: every byte of gradients,
  // parameters and optimizer state the step zeroes, sums, rounds, accumulates and
  // updates; optimizer_s: AdamW's part of it (the phase profile's "optimizer").
  double gemm_s = 0, attention_s = 0, elementwise_s = 0, loss_s = 0, state_s = 0;
  double optimizer_s = 0;
  double compute_s = 0;
  std::array<CollectiveTotals, kNumCollectiveKinds> comm{};  // by CollectiveKind
  double comm_s = 0;          // collectives' own duration
  double exposed_s = 0;       // compute thread waiting for them
  double overlap_cost_s = 0;  // compute slowed while they ran beside it
  double step_s = 0;
  double tokens_per_s = 0;
  std::string intra_transport, inter_transport;  // names of what the groups crossed ("" unused)
};

// The steady-state step (the third of three simulated, so zero1/zero2's all-gathers
// from the previous step are in it).
StepTimePrediction predict_step_time(const RunPlan& plan, const HardwareProfile& profile,
                                     const ClusterShape& cluster);

}  // namespace shardlm
