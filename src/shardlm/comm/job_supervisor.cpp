#include "shardlm/comm/job_supervisor.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

volatile sig_atomic_t g_stop_signal = 0;
volatile pid_t g_child = 0;

constexpr int kForwarded[] = {SIGTERM, SIGINT, SIGHUP};

extern "C" void forward_signal(int signal) {
  if (g_stop_signal == 0) g_stop_signal = signal;
  // mpirun ends the whole job on SIGTERM or SIGINT.
  if (g_child > 0) ::kill(g_child, signal == SIGINT ? SIGINT : SIGTERM);
}

// Installs the forwarding handlers for its lifetime (no SA_RESTART: waitpid returns).
class ForwardSignals {
 public:
  ForwardSignals() {
    struct sigaction action {};
    action.sa_handler = forward_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &action, &old_[i]);
  }
  ~ForwardSignals() {
    for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &old_[i], nullptr);
  }

 private:
  struct sigaction old_[std::size(kForwarded)] {};
};

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

JobExit run_supervised(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env,
                       double kill_after_seconds) {
  SHARDLM_CHECK(!argv.empty(), "internal: no command to run");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  g_stop_signal = 0;
  ForwardSignals forwarding;
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  SHARDLM_CHECK(pid >= 0, "cannot fork to start {}: {}", argv[0], std::strerror(errno));
  if (pid == 0) {
    // The job dies with its launcher, however the launcher dies (SIGKILL included).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(1);  // it died before the line above
    for (int s : kForwarded) ::signal(s, SIG_DFL);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "error: cannot run '%s': %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child = pid;
  if (g_stop_signal != 0) ::kill(pid, SIGTERM);  // arrived before g_child was set
  int status = 0;
  auto deadline = std::chrono::steady_clock::time_point::max();
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, g_stop_signal != 0 ? WNOHANG : 0);
    if (done == pid) break;
    SHARDLM_CHECK(done == 0 || errno == EINTR, "waiting for {} failed: {}", argv[0],
                  std::strerror(errno));
    if (g_stop_signal == 0) continue;
    const auto now = std::chrono::steady_clock::now();
    if (deadline == std::chrono::steady_clock::time_point::max())
      deadline = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(kill_after_seconds));
    if (now >= deadline) {
      ::kill(pid, SIGKILL);  // its ranks notice their parent is gone and exit
      deadline = now + std::chrono::hours(24);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  g_child = 0;
  return {exit_status(status), static_cast<int>(g_stop_signal)};
}

}  // namespace shardlm
