// What a training run will hold in memory per rank, and send per step, predicted
// from its configuration before it starts (`shardlm plan`).
//
// plan_run runs the real step on the meta device (plan/traced_step.hpp): the model,
// FlatUnitStrategy, HostOwnedState and the optimizer allocate as in a run, through
// MemoryTrackers by category, so the prediction equals the tracker's peak for params,
// grads, optimizer, activations, comm and frozen to the byte
// (tests/distributed/plan_matches_measurement.sh, tests/cli/device_emulated.sh); a
// disagreement is a bug in one of the two. Not planned: "other" (the data order, 8
// bytes per window of the training data, and the fallback GEMM's widening scratch on
// CPUs without bf16 instructions).
// Traffic is the bus bytes per rank of the step's collectives as the strategy issues
// them; the measured figure is within a few per cent of it (docs/parallelism.md).
// `program` is what the step-time model simulates (plan/time_model.hpp): the traced
// steps' compute, collectives and waits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/model/config.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/parallel/strategy_options.hpp"
#include "shardlm/plan/step_program.hpp"
#include "shardlm/plan/unit_work.hpp"

namespace shardlm {

struct RunPlanRequest {
  ModelConfig config;
  int world_size = 1;
  StrategyOptions strategy;
  ModelOptions model;
  int micro_batch = 8;
  int seq_len = 256;
  int global_batch = 0;  // sequences per step; 0: a micro-batch per data-parallel rank
  // --tensor-parallel T is strategy.tensor_parallel (the mesh's innermost dimension).
  int64_t min_unit_params = 65536;
  size_t comm_scratch_bytes = size_t{4} << 20;  // CommOptions::scratch_bytes
  // --offload optimizer (device runs) is strategy.optimizer_on_host.
};

struct RunPlan {
  int world_size = 1;
  int partition = 1;      // ranks a unit is sharded over
  int expert_parallel = 1;  // E: the expert group (the expert dimension, or expert x context)
  bool expert_spans_context = false;  // the expert group is expert x context (strategy_mesh)
  int context_parallel = 1;  // the mesh's context dimension
  int tensor_parallel = 1;  // the mesh's tensor dimension (innermost)
  int accumulation = 1;   // micro-batches per rank and step
  int64_t parameters = 0; // padded parameter count (Psi)
  // Peak bytes per rank.
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0;
  int64_t frozen = 0;  // parameters that do not train (LoRA's base)
  // The categories above are on the run's device (the host for --device cpu).
  int64_t total() const { return params + grads + optimizer + activations + comm + frozen; }
  Device device{};
  // A device run's host memory per rank, by the host tracker's category: the owned
  // state HostOwnedState holds there (a mirror for checkpoints; with --offload
  // optimizer the master, m, v and the gradient's accumulation for good). Zero for
  // --device cpu, whose state is all in the categories above.
  // comm: the world communicator's scratch, which carries host values (the device's
  // collectives go through the device communicator).
  struct Host {
    int64_t params = 0, grads = 0, optimizer = 0, frozen = 0, comm = 0;
    int64_t total() const { return params + grads + optimizer + frozen + comm; }
  } host;
  double wire_bytes_per_step = 0;  // bus bytes per rank and optimizer step
  double flops_per_step = 0;       // model FLOPs per rank and step (GEMMs + attention)
  double tokens_per_step = 0;      // global batch x sequence length
  DType precision = DType::fp32;   // compute type
  // For the step-time model: kPlannedSteps traced steps (the last is the steady one),
  // and each model unit's work per micro-batch (plan/unit_work.hpp), which the
  // program's compute carries at the unit's place.
  StepProgram program;
  std::vector<UnitWork> unit_work;
};

// Steps traced for the program: the third has the second's parameter all-gathers
// (zero1/zero2) waited for in it, as every later step does.
inline constexpr int kPlannedSteps = 3;

// The run's mesh: strategy_mesh of the request's strategy over the world (the tensor
// dimension innermost), the one the trainer lays out for the same flags.
MeshShape plan_mesh(const RunPlanRequest& request);

RunPlan plan_run(const RunPlanRequest& request);

// The steady (last) step's collectives over one kind of group, the scalar ones (8 bytes,
// at most 16 bus bytes: the trainer's and the norm's, a latency) left out: calls and
// bus bytes per rank.
struct GroupTraffic {
  int64_t calls = 0;
  double bus_bytes = 0;
};
GroupTraffic last_step_traffic(const RunPlan& plan, CommGroup group);

}  // namespace shardlm
