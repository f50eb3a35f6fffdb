// Times a StepProgram: the compute thread runs its ops in order; collectives run one
// at a time, in issue order, on the communication thread (comm/comm_thread.hpp), each
// starting when issued and when the one before it is done. A wait blocks the compute
// thread until its collective is done (exposed communication). While a collective is
// in flight, computation runs at that collective's compute share of its speed
// (TransportFigures::compute_share_during_comm: overlap is not free where
// communication needs the same cores).
#pragma once

#include <vector>

#include "shardlm/plan/step_program.hpp"

namespace shardlm {

struct SimulatedStep {
  double step_s = 0;          // from the previous step's end to this one's
  double compute_s = 0;       // compute work at full speed
  double exposed_s = 0;       // compute thread blocked in waits
  double overlap_cost_s = 0;  // compute slowed by concurrent collectives
  double comm_busy_s = 0;     // communication thread busy (collectives of this step)
  // Per collective kind: exposed wait charged to the collectives running meanwhile.
  std::vector<double> exposed_by_kind = std::vector<double>(kNumCollectiveKinds, 0.0);
};

// compute_seconds[i]: duration at full speed of ops[i] (compute ops; others ignored);
// collective_seconds[c] and compute_share[c] (in (0, 1]) of collectives[c]. Returns
// one entry per step_end.
std::vector<SimulatedStep> simulate_steps(const StepProgram& program,
                                          const std::vector<double>& compute_seconds,
                                          const std::vector<double>& collective_seconds,
                                          const std::vector<double>& compute_share);

}  // namespace shardlm
