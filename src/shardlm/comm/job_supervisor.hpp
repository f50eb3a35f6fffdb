// Running a job (mpirun and its ranks) so that it never outlives its launcher: the
// child gets a parent-death signal, and SIGTERM/SIGINT/SIGHUP sent to the launcher are
// forwarded to it, with SIGKILL if it has not ended a grace period later. (Ranks that
// lose mpirun notice by themselves: launcher_watch.hpp.)
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace shardlm {

struct JobExit {
  int status = 0;       // exit status, or 128 + signal when the job was killed
  int stop_signal = 0;  // the signal this process received and forwarded (0: none)
};

// Runs argv (PATH lookup) with the extra environment variables and waits for it.
// Error when it cannot be started.
JobExit run_supervised(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env,
                       double kill_after_seconds = 10.0);

}  // namespace shardlm
