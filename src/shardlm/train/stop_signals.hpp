// Preemption: SIGTERM, SIGINT or SIGUSR1 asks a training job to stop at a checkpoint.
// The first request is only recorded here; the trainer notices it at its next step
// boundary (run_control.hpp agrees on it across ranks), saves and exits with
// kExitStoppedAtCheckpoint. A later signal ends the process at once, by that signal,
// without a checkpoint (a save it interrupts is never committed, so the last good
// checkpoint stays). Copies of one request that arrive through several paths within
// kDuplicateWindowSeconds (Slurm signals every task and srun forwards its own; a
// terminal's Ctrl-C reaches launch, mpirun and the ranks) count as one.
#pragma once

#include <string>

namespace shardlm {

// The exit status of a job stopped by a signal after writing its checkpoint
// (sysexits.h's EX_TEMPFAIL: try again, with --resume).
inline constexpr int kExitStoppedAtCheckpoint = 75;
inline constexpr double kDuplicateWindowSeconds = 2.0;

// Installs the handlers for the life of the process (idempotent). `announce`: print
// one line on stderr when a signal arrives (rank 0; the other ranks stay quiet).
void install_stop_signal_handlers(bool announce);

// The signal of the first stop request, 0 when none arrived.
int stop_signal_received();

// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
std::string signal_name(int signal);

}  // namespace shardlm
