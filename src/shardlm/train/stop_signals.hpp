// Preemption: SIGTERM, SIGINT or SIGUSR1 asks a training job to stop at a checkpoint.
// The first request is only recorded here; the trainer notices it at its next step
// boundary (run_control.hpp agrees on it across ranks), saves and exits with
// kExitStoppedAtCheckpoint. A later signal ends the process at once, by that signal,
// without a checkpoint (a save it interrupts is never committed, so the last good
// checkpoint stays). Copies of one request that arrive through several paths within
// kDuplicateWindowSeconds (Slurm signals every task and srun forwards its own; a
// terminal's Ctrl-C reaches launch, mpirun and the ranks) count as one.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

// The exit status of a job stopped by a signal after writing its checkpoint
// (sysexits.h's EX_TEMPFAIL: try again, with --resume).
inline constexpr int kExitStoppedAtCheckpoint = 75;
inline constexpr double kDuplicateWindowSeconds = 2.0;

// Installs the handlers for the life of the process (idempotent), and makes them run
// on a thread of their own: the signals are blocked in the calling thread, so in every
// thread it starts afterwards (call it first, before MPI, OpenMP or the GEMM library
// start theirs). A signal then never interrupts compute: with the handler running on
// the thread inside oneDNN's GEMM, a SIGTERM in the middle of an sft step corrupted the
// heap every time (tests/cli/sft_run_directory.sh; cause inside the library not found).
void install_stop_signal_handlers();

// Whether a signal's arrival is printed (one line on stdout): rank 0 only.
void announce_stop_signals(bool announce);

// The signal of the first stop request, 0 when none arrived.
int stop_signal_received();

// Test-only: with SHARDLM_FAULT=hold_for_signal=RANK:STEP that rank, after STEP steps,
// waits for a stop signal (at most kHoldForSignalSeconds) before the step boundary that
// agrees on it, so a test's signal stops the run at STEP however fast the steps run (a
// 300-step run took 0.4 s on a quiet machine and ended before the test's SIGTERM came).
inline constexpr double kHoldForSignalSeconds = 60.0;
void hold_for_stop_signal_if_asked(int rank, int64_t steps_done);

// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
std::string signal_name(int signal);

}  // namespace shardlm
