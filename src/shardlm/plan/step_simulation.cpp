#include "shardlm/plan/step_simulation.hpp"

#include <algorithm>
#include <limits>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

struct Interval {
  double start, end, share;
  int kind;
};

// Runs `work` seconds of computation from `t`, slowed to `share` inside the busy
// intervals of the communication thread; advances `next` past intervals left behind.
double run_compute(double t, double work, const std::vector<Interval>& busy, size_t& next) {
  double remaining = work;
  while (remaining > 0) {
    while (next < busy.size() && busy[next].end <= t) ++next;
    if (next < busy.size() && busy[next].start <= t) {
      const double share = busy[next].share;
      const double can = (busy[next].end - t) * share;
      if (can >= remaining) return t + remaining / share;
      remaining -= can;
      t = busy[next].end;
    } else {
      const double free_until =
          next < busy.size() ? busy[next].start : std::numeric_limits<double>::infinity();
      if (t + remaining <= free_until) return t + remaining;
      remaining -= free_until - t;
      t = free_until;
    }
  }
  return t;
}

}  // namespace

std::vector<SimulatedStep> simulate_steps(const StepProgram& program,
                                          const std::vector<double>& compute_seconds,
                                          const std::vector<double>& collective_seconds,
                                          const std::vector<double>& compute_share) {
  SHARDLM_CHECK(compute_seconds.size() == program.ops.size() &&
                    collective_seconds.size() == program.collectives.size() &&
                    compute_share.size() == program.collectives.size(),
                "internal: durations for {} ops and {} collectives, program has {} and {}",
                compute_seconds.size(), collective_seconds.size(), program.ops.size(),
                program.collectives.size());
  for (double share : compute_share)
    SHARDLM_CHECK(share > 0 && share <= 1, "internal: compute share {} outside (0, 1]", share);
  std::vector<double> end(program.collectives.size(), -1.0);
  std::vector<Interval> busy;
  size_t next_busy = 0;
  double t = 0, last_comm_end = 0, step_start = 0;
  std::vector<SimulatedStep> steps;
  SimulatedStep current;
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const StepOp& op = program.ops[i];
    switch (op.kind) {
      case StepOp::Kind::compute: {
        const double work = compute_seconds[i];
        const double finish = run_compute(t, work, busy, next_busy);
        current.compute_s += work;
        current.overlap_cost_s += (finish - t) - work;
        t = finish;
        break;
      }
      case StepOp::Kind::issue: {
        const size_t c = static_cast<size_t>(op.collective);
        const double d = collective_seconds[c];
        const double start = std::max(t, last_comm_end);
        end[c] = start + d;
        last_comm_end = end[c];
        current.comm_busy_s += d;
        if (d > 0)
          busy.push_back({start, end[c], compute_share[c],
                          static_cast<int>(program.collectives[c].kind)});
        break;
      }
      case StepOp::Kind::wait: {
        const size_t c = static_cast<size_t>(op.collective);
        SHARDLM_CHECK(end[c] >= 0, "internal: wait for collective {} before it was issued", c);
        if (end[c] > t) {
          current.exposed_s += end[c] - t;
          // Charged to whatever the communication thread runs meanwhile (the FIFO may
          // still be busy with collectives queued before this one).
          for (size_t b = next_busy; b < busy.size() && busy[b].start < end[c]; ++b) {
            const double overlap = std::min(busy[b].end, end[c]) - std::max(busy[b].start, t);
            if (overlap > 0) current.exposed_by_kind[static_cast<size_t>(busy[b].kind)] += overlap;
          }
          t = end[c];
        }
        break;
      }
      case StepOp::Kind::step_end:
        current.step_s = t - step_start;
        step_start = t;
        steps.push_back(current);
        current = SimulatedStep{};
        break;
    }
  }
  return steps;
}

}  // namespace shardlm
