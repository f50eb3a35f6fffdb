// The metrics.jsonl record of one optimizer step (train/metrics.hpp writes it):
// loss, learning rate, gradient norm, speed, communication, phase times and memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/comm/counters.hpp"
#include "shardlm/core/device.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm {

struct StepOutcome {
  int64_t step = 0;          // 1-based: the step just completed
  double loss = 0.0;
  float lr = 0.0f;
  double grad_norm = 0.0;    // may be non-finite (fp16 overflow)
  double seconds = 0.0;
  int64_t tokens = 0;        // tokens in the step (global)
  bool applied = true;       // false: fp16 overflow skipped the update
  double loss_scale = 1.0;   // the loss scale the step ran with (fp16)
  // Mixture-of-experts models: the load-balancing loss (mean over the step's micro-
  // batches, before router_aux_loss_coef; `loss` includes coef x it when it is on).
  std::optional<double> aux_loss;
  // Mixture-of-experts models: the step's top-k assignments per expert over the global
  // batch (tokens routed to each, summed over the sparse layers): its load imbalance.
  std::vector<double> expert_tokens;
};

struct StepContext {
  int64_t tokens_seen = 0;
  double since_start_s = 0.0;
  int world_size = 1;
  std::string strategy;
  std::optional<double> loss_scale;   // fp16 runs: the scale the step ran with
  int64_t skipped_steps = 0;
  // The run's device: a device run adds "device_mem", that device's tracker ("mem" is
  // always the host's).
  Device device{};
};

nlohmann::json step_record(const StepOutcome& outcome, const StepContext& context,
                           const CommCounters& comm, const PhaseTotals& phases);

}  // namespace shardlm
