// The training step as the compute thread runs it: a sequence of compute work,
// collectives issued to the communication thread (one FIFO queue, as in comm/), and
// waits for them, built per strategy by following the same hooks FlatUnitStrategy and
// the trainer run (buckets launched during backward in bucket order; zero2/zero3
// reduce-scatter per unit during backward with two gradient buffers; zero3 all-gather
// with `--prefetch` units ahead and its buffer pool, resharding after forward or not;
// hybrid's replica all-reduce when a reduction is consumed; zero1/zero2 all-gathers
// after the optimizer, waited for before the next forward; the trainer's blocking
// scalar all-reduces). plan/step_simulation.hpp times it.
#pragma once

#include <string>
#include <vector>

#include "shardlm/comm/counters.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/parallel/strategy_options.hpp"
#include "shardlm/plan/unit_work.hpp"

namespace shardlm {

enum class CommGroup { world, shard, replica };

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

// Everything the program depends on (RunPlan::step carries one).
struct StepShape {
  StrategyOptions strategy;
  int world_size = 1;
  int partition = 1;  // ranks a unit is sharded over
  int accumulation = 1;
  std::vector<int64_t> unit_numel;          // per flat unit, padded
  std::vector<bool> trainable;              // per flat unit; empty: all (frozen: no reduce)
  std::vector<bool> raw;                    // per flat unit; empty: none (QLoRA: fp32 words, never rounded)
  std::vector<int> flat_unit_of;            // per model unit
  std::vector<std::vector<int>> flat_needs; // per model unit: flat units it reads
  std::vector<UnitWork> work;               // per model unit, one micro-batch
  std::vector<bool> shared_unit;            // per flat unit (FlatUnitStrategy)
  int param_pool = 0, grad_pool = 0;        // zero3 gather / zero2+ gradient buffers
  std::vector<std::vector<int>> buckets;    // ddp/zero1, launch order
  DType param_type = DType::fp32;           // what the model reads
  bool compute_copy = false;                // replicated params kept in param_type too
  size_t comm_scratch_bytes = size_t{4} << 20;
};

// Messages a rank sends in one collective of `bytes` algorithm bytes over `group_size`
// ranks, by the algorithms of comm/mpi_algorithms.hpp: all-gather N-1; reduce-scatter
// N-1 per scratch-sized chunk round; all-reduce both, or one all-gather when small.
double collective_messages(CollectiveKind kind, double bytes, int group_size,
                           size_t scratch_bytes, size_t element_bytes);

// Bytes AdamW reads and writes updating `owned` parameters (fp32 master, gradient,
// two moments: 16 read, 12 written), plus 2 per parameter when it also writes the
// bf16 copy (ddp in bf16).
double adamw_state_bytes(double owned, bool writes_bf16_copy);

StepProgram build_step_program(const StepShape& shape, int steps);

}  // namespace shardlm
