// The training step traced on the meta device (issue 24: plan runs the real
// schedule). trace_step builds what a run builds (the family's model, the layout, the
// mesh, FlatUnitStrategy, HostOwnedState for a device run, AdamWOptimizer) on meta
// backends (backend/meta: sizes, no storage) over a RecordingCommunicator at the
// planned world size (one rank simulated: every rank of the symmetric mesh does the
// same), runs `steps` optimizer steps through the strategy's hooks and the model's
// units (train/model_runner) as the trainer runs them, and reads back:
//  - the peak bytes per memory category the trackers counted, on the planned device
//    and, for a device run, on the host: what the real run's trackers count, because
//    every allocation is the real code's;
//  - every collective with its group, bytes and label, and the order of compute,
//    issue and wait: the StepProgram the step-time model simulates. Its compute is
//    what the meta kernels recorded (the strategy's and the optimizer's state work:
//    zeroing, rounding, accumulating, norms, AdamW), except inside a model unit,
//    whose forward or backward counts as that unit's UnitWork (plan/unit_work.hpp):
//    the conventions the hardware profiles' rates and `calibrate` are measured in,
//    shared out over the stretches between the unit's own collectives (tensor,
//    context and expert exchanges) as its kernels' work was.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/plan/step_program.hpp"
#include "shardlm/plan/unit_work.hpp"

namespace shardlm {

struct TracedStep {
  using Peaks = std::array<int64_t, MemoryTracker::kNumCategories>;
  Peaks device{};  // the planned device's (for --device cpu: the host's, everything)
  Peaks host{};    // a device run's host memory; zero for --device cpu
  StepProgram program;  // `steps` steps, each ending with step_end
  // Bus bytes per rank of the last step's collectives on parameters and gradients:
  // the trainer's and the norm's blocking scalar all-reduces (8 bytes each, a
  // latency, not a traffic) are left out.
  double wire_bytes_per_step = 0;

  int64_t device_peak(MemCategory c) const { return device[static_cast<size_t>(c)]; }
  int64_t host_peak(MemCategory c) const { return host[static_cast<size_t>(c)]; }
};

// unit_work: per model unit, one micro-batch's work (model_unit_work).
TracedStep trace_step(const RunPlanRequest& request, int steps,
                      const std::vector<UnitWork>& unit_work);

}  // namespace shardlm
