// The training step as the compute thread runs it: a sequence of compute work,
// collectives issued to the communication thread (one FIFO queue, as in comm/), and
// waits for them. It is not rebuilt here: plan/traced_step.hpp records it by running
// the real step (the strategy's hooks, the model's units, the optimizer) on the meta
// device with a recording communicator. plan/step_simulation.hpp times it.
#pragma once

#include <string>
#include <vector>

#include "shardlm/comm/counters.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/plan/unit_work.hpp"

namespace shardlm {

// expert: the expert group (E ranks, P x T apart; when it spans the context ranks, runs
// of P ranks T apart, E/P x T apart); expert_data: the ranks that hold the same experts
// (shard x context under expert parallelism, shard alone when it spans them);
// tensor: the tensor group (T consecutive ranks, the mesh's innermost dimension).
enum class CommGroup { world, shard, replica, context, expert, expert_data, tensor };

struct PlannedCollective {
  CollectiveKind kind = CollectiveKind::all_reduce;
  CommGroup group = CommGroup::world;
  double bus_bytes = 0;  // per rank, as comm/counters.hpp counts them
  double messages = 0;   // point-to-point messages a rank sends (latency terms)
  std::string label;
};

struct StepOp {
  enum class Kind { compute, issue, wait, step_end };
  Kind kind = Kind::compute;
  ComputeWork work;     // compute
  int collective = -1;  // issue, wait
  std::string label;    // compute
};

struct StepProgram {
  std::vector<PlannedCollective> collectives;
  std::vector<StepOp> ops;  // `steps` consecutive steps, each ending with step_end
};

// Messages a rank sends in one collective of `bytes` algorithm bytes over `group_size`
// ranks, by the algorithms of comm/mpi_algorithms.hpp: all-gather N-1; reduce-scatter
// N-1 per scratch-sized chunk round; all-reduce both, or one all-gather when small;
// all-to-all N-1; send and send_recv one (a recv sends none).
double collective_messages(CollectiveKind kind, double bytes, int group_size,
                           size_t scratch_bytes, size_t element_bytes);

// Bytes AdamW reads and writes updating `owned` parameters (fp32 master, gradient,
// two moments: 16 read, 12 written), plus 2 per parameter when it also writes the
// bf16 copy (ddp in bf16).
double adamw_state_bytes(double owned, bool writes_bf16_copy);

}  // namespace shardlm
