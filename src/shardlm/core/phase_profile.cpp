#include "shardlm/core/phase_profile.hpp"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

// One per thread. Durations stay in the clock's integer ticks until they are taken,
// so exclusive = inclusive - nested is exact.
struct ThreadProfile {
  PhaseScope* open = nullptr;  // innermost open scope
  std::array<Clock::duration, kNumPhases> exclusive{};
  std::array<int64_t, kNumPhases> calls{};
};

thread_local ThreadProfile t_profile;

}  // namespace

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::gemm: return "gemm";
    case Phase::attention: return "attention";
    case Phase::norms_elementwise: return "norms_elementwise";
    case Phase::loss: return "loss";
    case Phase::optimizer: return "optimizer";
  }
  return "unknown";
}

double PhaseTotals::total_seconds() const {
  double total = 0.0;
  for (double s : seconds) total += s;
  return total;
}

PhaseTotals take_phase_totals() {
  PhaseTotals totals;
  for (int p = 0; p < kNumPhases; ++p) {
    totals.seconds[p] = std::chrono::duration<double>(t_profile.exclusive[p]).count();
    totals.calls[p] = t_profile.calls[p];
  }
  t_profile.exclusive.fill(Clock::duration::zero());
  t_profile.calls.fill(0);
  return totals;
}

PhaseScope::PhaseScope(Phase phase) noexcept : phase_(phase), parent_(t_profile.open) {
  t_profile.open = this;
  start_ = Clock::now();  // last, so the bookkeeping above is not charged
}

PhaseScope::~PhaseScope() {
  const Clock::duration inclusive = Clock::now() - start_;
  const auto p = static_cast<size_t>(phase_);
  t_profile.exclusive[p] += inclusive - nested_;
  ++t_profile.calls[p];
  if (parent_ != nullptr) parent_->nested_ += inclusive;
  t_profile.open = parent_;
}

}  // namespace shardlm
