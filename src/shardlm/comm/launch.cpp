#include "shardlm/comm/launch.hpp"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

int count_physical_cores() {
  namespace fs = std::filesystem;
  std::set<std::pair<int, int>> cores;  // (package, core)
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/cpu", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("cpu", 0) != 0 || name.size() <= 3 ||
        name.find_first_not_of("0123456789", 3) != std::string::npos)
      continue;
    std::ifstream package(entry.path() / "topology/physical_package_id");
    std::ifstream core(entry.path() / "topology/core_id");
    int package_id = 0;
    int core_id = 0;
    if (package >> package_id && core >> core_id) cores.emplace(package_id, core_id);
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  return std::max(1u, std::thread::hardware_concurrency());
}

volatile uint64_t single_copy_marker = 0;

// Open MPI's shared-memory transport copies large messages with process_vm_readv
// between sibling ranks (CMA). Containers without ptrace rights refuse it, and then
// the transport fails at run time; this reproduces the situation with two forked
// siblings. Children only make async-signal-safe calls.
bool probe_single_copy() {
  constexpr uint64_t kExpected = 0x5a17d1c0ffee1234ull;
  single_copy_marker = kExpected;
  int hold[2];
  int ready[2];
  if (pipe(hold) != 0) return false;
  if (pipe(ready) != 0) {
    close(hold[0]);
    close(hold[1]);
    return false;
  }
  const pid_t target = fork();
  if (target == 0) {
    close(hold[1]);  // so that the parent closing its end is seen as end-of-file
    close(ready[0]);
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // what Open MPI's vader does too
    char byte = 1;
    (void)!write(ready[1], &byte, 1);
    (void)!read(hold[0], &byte, 1);  // until the parent closes hold[1]
    _exit(0);
  }
  bool works = false;
  char byte = 0;
  if (target > 0 && read(ready[0], &byte, 1) == 1) {
    const pid_t reader = fork();
    if (reader == 0) {
      uint64_t value = 0;
      iovec local{&value, sizeof(value)};
      iovec remote{const_cast<uint64_t*>(&single_copy_marker), sizeof(value)};
      const ssize_t got = process_vm_readv(target, &local, 1, &remote, 1, 0);
      _exit(got == static_cast<ssize_t>(sizeof(value)) && value == kExpected ? 0 : 1);
    }
    int status = 0;
    if (reader > 0 && waitpid(reader, &status, 0) == reader)
      works = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  close(hold[1]);
  close(ready[1]);
  if (target > 0) waitpid(target, nullptr, 0);
  close(hold[0]);
  close(ready[0]);
  return works;
}

}  // namespace

LaunchEnvironment probe_launch_environment() {
  LaunchEnvironment env;
  env.physical_cores = count_physical_cores();
  env.running_as_root = geteuid() == 0;
  env.single_copy_works = probe_single_copy();
  return env;
}

std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& program_args,
                                        const LaunchEnvironment& environment) {
  SHARDLM_CHECK(n >= 1, "number of processes must be at least 1, got {}", n);
  std::vector<std::string> command = {"mpirun", "-n", std::to_string(n)};
  // More ranks than cores is fine for tests and small runs; Open MPI refuses it unless told.
  if (n > environment.physical_cores) command.push_back("--oversubscribe");
  if (environment.running_as_root) command.push_back("--allow-run-as-root");
  if (!environment.single_copy_works)
    command.insert(command.end(), {"--mca", "btl_vader_single_copy_mechanism", "none"});
  command.insert(command.end(), program_args.begin(), program_args.end());
  return command;
}

std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& program_args) {
  return mpirun_command(n, program_args, probe_launch_environment());
}

}  // namespace shardlm
