// Running another program (mpirun, this binary, a script) and waiting for it with a
// deadline, for commands that orchestrate runs (`calibrate`, `bench`).
#pragma once

#include <string>
#include <vector>

namespace shardlm {

struct CommandResult {
  int status = 0;         // exit status; 128 + signal when killed
  bool timed_out = false; // killed (with its process group) at the deadline
};

// Runs argv (PATH searched) in its own process group with stdout and stderr sent to
// `log_path` (appended; "" keeps the caller's), waits at most timeout_seconds, then
// kills the group. Error when it cannot be started.
CommandResult run_command(const std::vector<std::string>& argv, double timeout_seconds,
                          const std::string& log_path = "");

// The real path of the running binary (/proc/self/exe), for starting it again.
std::string self_executable();

// Words of a command given as one string, split at whitespace (no quoting).
std::vector<std::string> split_words(const std::string& text);

// argv joined with spaces, quoting arguments that need it (for logs and errors).
std::string command_line(const std::vector<std::string>& argv);

}  // namespace shardlm
