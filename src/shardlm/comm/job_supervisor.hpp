// Running a job (mpirun and its ranks) so that it never outlives its launcher and can
// stop cleanly when the launcher is asked to stop: the child gets a parent-death
// signal, runs in its own process group (a terminal's Ctrl-C reaches the launcher only)
// with stdin from /dev/null, and SIGTERM/SIGINT/SIGHUP sent to the launcher become,
// for the child:
//   SIGUSR1 at once (mpirun forwards it to every rank and keeps the job running; a
//     shardlm rank then stops at its next step with a checkpoint),
//   SIGTERM when it has not ended `grace_seconds` later or a second signal reaches the
//     launcher (more than kDuplicateWindowSeconds after the first: copies of one
//     signal sent through several paths count once); mpirun ends the job on it,
//   SIGKILL kKillAfterTermSeconds after that.
// (Ranks that lose mpirun notice by themselves: launcher_watch.hpp.)
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace shardlm {

struct JobExit {
  int status = 0;       // exit status, or 128 + signal when the job was killed
  int stop_signal = 0;  // the signal this process received and passed on (0: none)
  bool ended = false;   // it did not stop by itself: SIGTERM/SIGKILL ended it
};

inline constexpr double kSupervisorDuplicateWindowSeconds = 2.0;
inline constexpr double kKillAfterTermSeconds = 10.0;

// Runs argv (PATH lookup) with the extra environment variables and waits for it.
// Error when it cannot be started.
JobExit run_supervised(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env,
                       double grace_seconds = 60.0);

}  // namespace shardlm
