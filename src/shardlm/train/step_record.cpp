#include "shardlm/train/step_record.hpp"

#include <cmath>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/train/metrics.hpp"

namespace shardlm {

nlohmann::json step_record(const StepOutcome& o, const StepContext& c, const CommCounters& comm,
                           const PhaseTotals& phases) {
  nlohmann::json record = {
      {"step", o.step},
      {"loss", o.loss},
      {"lr", o.lr},
      {"grad_norm", std::isfinite(o.grad_norm) ? nlohmann::json(o.grad_norm) : nlohmann::json()},
      {"tokens_per_s", static_cast<double>(o.tokens) / o.seconds},
      {"step_ms", o.seconds * 1e3},
      {"tokens_seen", c.tokens_seen},
      {"since_start_s", c.since_start_s},
      {"world_size", c.world_size},
      {"strategy", c.strategy},
      {"comm_bytes", comm.total().bus_bytes},
      {"comm_ms", comm.total().seconds * 1e3},
      {"exposed_comm_ms", comm.exposed_seconds * 1e3},
      {"comm", comm.to_json()},
      {"mem", MemoryTracker::global().to_json()}};
  if (!c.device.is_host()) {
    record["device"] = to_string(c.device);
    record["device_mem"] = MemoryTracker::for_device(c.device).to_json();
  }
  if (o.aux_loss) record["aux_loss"] = *o.aux_loss;
  if (!o.expert_tokens.empty()) record["expert_tokens"] = o.expert_tokens;
  record["phase_ms"] = phase_ms_json(phases, o.seconds, comm.exposed_seconds);
  if (c.loss_scale) {
    record["loss_scale"] = *c.loss_scale;  // the scale this step ran with
    record["skipped_steps"] = c.skipped_steps;
    if (!o.applied) record["skipped"] = true;
  }
  return record;
}

}  // namespace shardlm
