// StrategyBufferPlan: what a FlatUnitStrategy allocates per rank at start-up (it
// allocates nothing later): the one arithmetic its flat units and pools follow
// (FlatUnitStrategy::plan_buffers computes it; `shardlm plan` measures the same
// allocations on the meta device, plan/traced_step.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/core/dtype.hpp"

namespace shardlm {

struct StrategyBufferPlan {
  bool shard_params = false, shard_grads = false, shard_optimizer = false;
  // Gradients held in pooled full-unit buffers only while a unit is differentiated
  // and reduced: zero2/zero3/hybrid, and every strategy with the optimizer on the host
  // (the reduced slice then accumulates in host memory).
  bool transient_grads = false;
  // Of what the model reads (gathered or copied); with the optimizer on the host, what
  // trainable units are stored in on the device (the compute type, no fp32 master).
  DType param_type = DType::fp32;
  bool compute_copy = false;        // replicated params also kept in param_type (bf16)
  // What frozen units (not raw) are stored in: the run's compute type (bf16, fp16), once,
  // with no fp32 master and no compute copy; fp32 in an fp32 run.
  DType frozen_type = DType::fp32;
  // --offload optimizer: trainable units keep only their parameters (param_type) here;
  // no fp32 master, persistent gradient or AdamW state (host_* below has them).
  bool optimizer_on_host = false;
  std::vector<bool> shared_unit;    // flat units another model unit reads (tied head)
  int64_t largest_private_unit = 0; // elements
  int64_t gather_buffer_bytes = 0;  // zero3/hybrid: one gather buffer (largest private unit)
  int64_t largest_trainable_private_unit = 0;  // what a transient gradient buffer holds
  int param_pool = 0;               // zero3/hybrid gather buffers of that size
  int grad_pool = 0;                // zero2/zero3 transient gradient buffers of that size
  int64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  int64_t frozen_bytes = 0;  // frozen units' parameters, in frozen_type (raw: words)
  // What a device run's HostOwnedState allocates in host memory, by the host tracker's
  // category (parallel/host_owned_state.hpp): the owned elements' fp32 master (params),
  // AdamW m and v (optimizer) and frozen weights as stored (frozen), mirrored or, with
  // the optimizer on the host, held there for good, with then the reduced gradient's
  // fp32 accumulation plus one staging slice for the copies (grads). Unused on the host.
  int64_t host_params_bytes = 0, host_grads_bytes = 0, host_optimizer_bytes = 0;
  int64_t host_frozen_bytes = 0;
  // Raw units (quantized, UnitLayout::raw) are handed out, gathered and kept as stored:
  // fp32 words, no compute copy.
  // zero3/hybrid: all-gathers of each flat unit per training micro-batch (a unit that
  // consecutive steps need stays gathered between them).
  std::vector<int> gathers_per_micro_batch;
};

}  // namespace shardlm
