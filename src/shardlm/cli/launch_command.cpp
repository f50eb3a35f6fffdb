// `shardlm launch -n N [--max-restarts R] [--grace-s G] -- train|sft ...`: runs mpirun
// with the flags this machine needs and, for training jobs, restarts a failed job from
// its newest valid checkpoint (or from step 0 when it died before its first one). The
// job never outlives launch: SIGTERM/SIGINT/SIGHUP to launch ask it to stop at a
// checkpoint and end it if it has not within G seconds (comm/job_supervisor.hpp), and
// launch's death ends it too.
#include <unistd.h>

#include <algorithm>
#include <cmath>  // std::isfinite
#include <cstdio>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <memory>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/comm/job_supervisor.hpp"
#include "shardlm/comm/launch.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/train/stop_signals.hpp"

namespace shardlm::cli {

namespace {

struct LaunchArgs {
  int processes = 1;
  int max_restarts = 0;
  double grace_s = 60.0;
  std::string hosts;
  std::vector<std::string> command;
  std::vector<std::string> subcommands;  // what the job may run: shardlm's own subcommands
};

std::string flag_value(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
  }
  return "";
}

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  return std::find(args.begin(), args.end(), flag) != args.end();
}

std::string this_binary() {
  // mpirun starts the same binary as this one, by its real path.
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "/proc/self/exe";
}

// Whether a person watches launch's stdout: the job's ranks are told (SHARDLM_STDOUT_TTY),
// since under mpirun they cannot tell for themselves (train/progress.hpp).
bool launch_stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

// A job that ends abnormally can leave a redrawn progress line open on the terminal:
// launch's next message then starts on a line of its own.
bool job_line_may_be_open = false;

void say(const std::string& line) {
  std::fflush(stdout);
  if (job_line_may_be_open) std::fputs("\n", stderr);
  job_line_may_be_open = false;
  std::fprintf(stderr, "launch: %s\n", line.c_str());
}

// What a restart continues from: the newest valid checkpoint's step, or 0 when the
// run directory has none committed; nullopt when its checkpoints are all damaged.
std::optional<std::pair<int64_t, std::string>> restart_point(const std::string& run_dir) {
  try {
    const auto checkpoint = open_newest_valid_checkpoint(run_dir, print_checkpoint_warning);
    if (!checkpoint) return std::make_pair(int64_t{0}, std::string("step 0 (no checkpoint yet)"));
    return std::make_pair(checkpoint->info().step, checkpoint->dir());
  } catch (const Error& e) {
    say(e.what());
    return std::nullopt;
  }
}

int launch(const LaunchArgs& args) {
  SHARDLM_CHECK(!args.command.empty(),
                "launch needs a shardlm command after '--', e.g. shardlm launch -n 2 -- train ...");
  // Refused here, before mpirun starts N copies that would each refuse it.
  SHARDLM_CHECK(std::find(args.subcommands.begin(), args.subcommands.end(), args.command.front()) !=
                    args.subcommands.end(),
                "launch: '{}' is not a shardlm subcommand (expected one of: {})", args.command.front(),
                fmt::join(args.subcommands, ", "));
  SHARDLM_CHECK(args.processes >= 1, "-n must be at least 1, got {}", args.processes);
  SHARDLM_CHECK(args.max_restarts >= 0, "--max-restarts must be >= 0, got {}", args.max_restarts);
  SHARDLM_CHECK(std::isfinite(args.grace_s) && args.grace_s >= 0 && args.grace_s <= 86400,
                "--grace-s must be a number of seconds in [0, 86400], got {}", args.grace_s);
  std::vector<std::string> job = args.command;
  // The subcommands that train a run directory (and can continue it from a checkpoint).
  const bool training = job.front() == "train" || job.front() == "sft";
  const std::string run_dir = training ? flag_value(job, "--out") : "";
  bool resumes = has_flag(job, "--resume") || has_flag(job, "--resume-if-exists");
  // A restart continues from what the run directory holds. That is this job's own
  // progress only if the job resumes anyway or the directory held no checkpoint when
  // it started (otherwise the first attempt refused someone else's run).
  const bool may_restart = training && !run_dir.empty() && (resumes || list_checkpoints(run_dir).empty());
  int64_t failed_at_step = -1;
  for (int restart = 0;; ++restart) {
    std::vector<std::string> program_args = {this_binary()};
    program_args.insert(program_args.end(), job.begin(), job.end());
    std::vector<std::string> argv = mpirun_command(args.processes, program_args);
    if (!args.hosts.empty()) argv.insert(argv.begin() + 1, {"-H", args.hosts});
    say(fmt::format("{}", fmt::join(argv, " ")));
    const JobExit exit = run_supervised(argv,
                                        {{"SHARDLM_RESTART_COUNT", std::to_string(restart)},
                                         {"SHARDLM_STDOUT_TTY", launch_stdout_is_terminal() ? "1" : "0"}},
                                        args.grace_s);
    job_line_may_be_open = launch_stdout_is_terminal() && exit.status != 0;
    if (exit.stop_signal != 0) {
      if (exit.status == kExitStoppedAtCheckpoint && !exit.ended) {
        say(fmt::format("stopped by signal {} ({}): the job wrote a checkpoint and exited with "
                        "status {}; continue with --resume",
                        exit.stop_signal, signal_name(exit.stop_signal), exit.status));
        return kExitStoppedAtCheckpoint;
      }
      say(fmt::format("stopped by signal {} ({}); the job was ended{} (status {})",
                      exit.stop_signal, signal_name(exit.stop_signal),
                      exit.ended ? fmt::format(" (it had not stopped within --grace-s {} or a "
                                               "second signal came)", args.grace_s)
                                 : "",
                      exit.status));
      return 128 + exit.stop_signal;
    }
    if (exit.status == 0) return 0;
    if (exit.status == kExitStoppedAtCheckpoint) {
      // A signal reached the ranks without passing through launch (srun, a batch system
      // or a user signalling them): they were asked to stop, not restarted.
      say(fmt::format("the job stopped at a checkpoint (status {}: a signal reached its ranks); "
                      "not restarting; continue with --resume",
                      exit.status));
      return exit.status;
    }
    auto give_up = [&](const std::string& why) {
      say(fmt::format("job exited with status {}{}", exit.status, why));
      return exit.status;
    };
    if (!training || args.max_restarts == 0) return give_up("");
    if (restart >= args.max_restarts)
      return give_up(fmt::format("; {} restart(s) used, giving up", restart));
    if (!may_restart)
      return give_up("; not restarting: the run directory held checkpoints before this job "
                     "started and the job does not resume them (add --resume)");
    const auto point = restart_point(run_dir);
    if (!point) return give_up("; not restarting: its checkpoints are all damaged");
    if (point->first == failed_at_step)
      return give_up(fmt::format(
          "; failed again with no progress past checkpoint step {}; giving up", point->first));
    failed_at_step = point->first;
    if (!resumes) job.push_back("--resume-if-exists");
    resumes = true;
    say(fmt::format("job exited with status {}; restarting from {} (restart {} of {})", exit.status,
                    point->second, restart + 1, args.max_restarts));
  }
}

}  // namespace

void register_launch(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  auto* cmd = app.add_subcommand(
      "launch", "Run a shardlm command on N processes with mpirun (restarting failed training, "
      "stopping it at a checkpoint on SIGTERM)");
  cmd->add_option("-n,--processes", args->processes, "Number of processes (ranks)")->required();
  cmd->add_option("--max-restarts", args->max_restarts,
                  "Restart a failed training job (train, sft) up to R times, from its newest valid "
                  "checkpoint (from step 0 if it had none yet)")
      ->capture_default_str();
  cmd->add_option("--grace-s", args->grace_s,
                  "On SIGTERM/SIGINT/SIGHUP: seconds the job may take to finish its step and "
                  "write a checkpoint (it is asked with SIGUSR1) before it is ended; a second "
                  "signal ends it at once")
      ->capture_default_str();
  cmd->add_option("--hosts", args->hosts, "Hosts for mpirun -H (e.g. a,b)");
  cmd->add_option("command", args->command, "The shardlm command to run, after '--'")->required();
  cmd->callback([args, &app]() {
    args->subcommands.clear();
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() != "launch") args->subcommands.push_back(sub->get_name());
    const int status = launch(*args);
    if (status != 0) std::exit(status);
  });
}

}  // namespace shardlm::cli
