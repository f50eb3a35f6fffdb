// `shardlm launch -n N [--max-restarts R] -- train ...`: runs mpirun with the flags
// this machine needs and, for training jobs, restarts a failed job from its newest
// checkpoint (fault tolerance).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <memory>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/comm/launch.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/timer.hpp"

namespace shardlm::cli {

namespace {

struct LaunchArgs {
  int processes = 1;
  int max_restarts = 0;
  std::string hosts;
  std::vector<std::string> command;
};

// Runs argv, waits, and returns its exit status (128 + signal when killed).
int run_and_wait(const std::vector<std::string>& argv, int restart) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  SHARDLM_CHECK(pid >= 0, "cannot fork to start mpirun: {}", std::strerror(errno));
  if (pid == 0) {
    setenv("SHARDLM_RESTART_COUNT", std::to_string(restart).c_str(), 1);
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "error: cannot run '%s': %s (is Open MPI installed?)\n", cargv[0],
                 std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    SHARDLM_CHECK(errno == EINTR, "waiting for mpirun failed: {}", std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

std::string flag_value(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
  }
  return "";
}

int launch(const LaunchArgs& args) {
  SHARDLM_CHECK(!args.command.empty(),
                "launch needs a shardlm command after '--', e.g. shardlm launch -n 2 -- train ...");
  SHARDLM_CHECK(args.max_restarts >= 0, "--max-restarts must be >= 0, got {}", args.max_restarts);
  std::vector<std::string> program = {"/proc/self/exe"};
  {
    // mpirun starts the same binary as this one, by its real path.
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (n > 0) program[0] = std::string(path, static_cast<size_t>(n));
  }
  std::vector<std::string> job = args.command;
  const bool training = job.front() == "train";
  const std::string run_dir = training ? flag_value(job, "--out") : "";
  int64_t failed_at_step = -1;
  for (int restart = 0;; ++restart) {
    std::vector<std::string> program_args = program;
    program_args.insert(program_args.end(), job.begin(), job.end());
    std::vector<std::string> argv = mpirun_command(args.processes, program_args);
    if (!args.hosts.empty()) argv.insert(argv.begin() + 1, {"-H", args.hosts});
    std::fprintf(stderr, "launch: %s\n", fmt::format("{}", fmt::join(argv, " ")).c_str());
    const int status = run_and_wait(argv, restart);
    if (status == 0) return 0;
    std::unique_ptr<CheckpointReader> checkpoint;
    if (!run_dir.empty()) checkpoint = open_newest_valid_checkpoint(run_dir, print_checkpoint_warning);
    if (restart >= args.max_restarts || !checkpoint) {
      std::fprintf(stderr, "launch: job exited with status %d%s\n", status,
                   restart >= args.max_restarts && args.max_restarts > 0
                       ? fmt::format("; {} restart(s) used, giving up", restart).c_str()
                   : !training || args.max_restarts == 0 ? ""
                                                         : "; no checkpoint to restart from");
      return status;
    }
    const int64_t step = checkpoint->info().step;
    if (step == failed_at_step) {
      std::fprintf(stderr,
                   "launch: job failed again with no progress past checkpoint step %lld; giving up\n",
                   static_cast<long long>(step));
      return status;
    }
    failed_at_step = step;
    if (std::find(job.begin(), job.end(), "--resume") == job.end()) job.push_back("--resume");
    std::fprintf(stderr, "launch: job exited with status %d; restarting from %s (restart %d of %d)\n",
                 status, checkpoint->dir().c_str(), restart + 1, args.max_restarts);
  }
}

}  // namespace

void register_launch(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  auto* cmd = app.add_subcommand(
      "launch", "Run a shardlm command on N processes with mpirun (restarting failed training)");
  cmd->add_option("-n,--processes", args->processes, "Number of processes (ranks)")->required();
  cmd->add_option("--max-restarts", args->max_restarts,
                  "Restart a failed training job from its newest checkpoint up to R times")
      ->capture_default_str();
  cmd->add_option("--hosts", args->hosts, "Hosts for mpirun -H (e.g. a,b)");
  cmd->add_option("command", args->command, "The shardlm command to run, after '--'")->required();
  cmd->callback([args]() {
    const int status = launch(*args);
    if (status != 0) std::exit(status);
  });
}

}  // namespace shardlm::cli
