// The mpirun command line that starts N ranks of a program on this machine with the
// flags it needs here (see docs/communication.md for why each one is there).
#pragma once

#include <string>
#include <vector>

namespace shardlm {

struct LaunchEnvironment {
  int physical_cores = 1;         // Open MPI's default slot count on a plain machine
  bool running_as_root = false;   // Open MPI refuses root without a flag
  bool single_copy_works = true;  // process_vm_readv between sibling processes (CMA)
};

// Probes this machine (sysfs topology, euid, a CMA read between two forked processes).
LaunchEnvironment probe_launch_environment();

// {"mpirun", "-n", "N", [--oversubscribe], [--allow-run-as-root],
//  [--mca btl_vader_single_copy_mechanism none], program_args...}
std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& program_args,
                                        const LaunchEnvironment& environment);
std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& program_args);

}  // namespace shardlm
