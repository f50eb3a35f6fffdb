// Always-on phase profile: where a training step's wall time goes (GEMMs,
// attention, norms and elementwise kernels, loss, optimizer).
//
// A PhaseScope at the entry of each CPU kernel charges the wall time of that call to
// its phase, on the calling thread. Times are EXCLUSIVE: a scope opened inside
// another (the GEMMs inside the fused LM-head loss) is charged to the inner phase
// and subtracted from the outer one, so one thread's phases never add up to more
// than the wall time they cover, and nothing is counted twice.
//
// Cost: two steady_clock reads and a few thread-local updates per scope (tens of
// nanoseconds), i.e. per kernel call, never per element. Scopes belong at kernel
// entry, on the thread that calls the kernel (the trainer's thread); the OpenMP
// workers inside a kernel open none. Each thread keeps its own totals, and
// take_phase_totals() reads and resets the calling thread's: the trainer takes them
// once per step. Communication is not a phase here: the communicator measures the
// compute thread's exposed wait itself (CommCounters::exposed_seconds).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace shardlm {

enum class Phase : int { gemm, attention, norms_elementwise, loss, optimizer };
inline constexpr int kNumPhases = 5;

// "gemm", "attention", "norms_elementwise", "loss", "optimizer" (metrics keys).
std::string_view phase_name(Phase phase);

struct PhaseTotals {
  std::array<double, kNumPhases> seconds{};  // exclusive wall time per phase
  std::array<int64_t, kNumPhases> calls{};   // scopes closed per phase

  double seconds_of(Phase phase) const { return seconds[static_cast<size_t>(phase)]; }
  int64_t calls_of(Phase phase) const { return calls[static_cast<size_t>(phase)]; }
  double total_seconds() const;
};

// The calling thread's totals since its previous take (or its start), then zeroes
// them. Scopes still open at that moment are charged when they close, i.e. to the
// next take: take between kernel calls.
PhaseTotals take_phase_totals();

class PhaseScope {
 public:
  explicit PhaseScope(Phase phase) noexcept;
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  Phase phase_;
  PhaseScope* parent_;               // the scope this one was opened in, if any
  Clock::duration nested_{};         // inclusive time of the scopes opened inside this one
  Clock::time_point start_;
};

}  // namespace shardlm
