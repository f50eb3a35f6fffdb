// Ranks must not outlive the launcher that started them: a rank whose parent process
// (mpirun, or Open MPI's daemon on another host) is gone stops, instead of training
// on and writing checkpoints nobody asked for.
#pragma once

#include <string>

namespace shardlm {

// Starts (once per process) a thread that checks every 200 ms whether the process's
// parent has changed; when it has, prints "<who>: the launcher that started this
// process (pid P) is gone; exiting" and ends the process with status 1.
void exit_when_launcher_dies(const std::string& who);

}  // namespace shardlm
