#include "shardlm/comm/job_supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

using Clock = std::chrono::steady_clock;

// Lock-free atomics: the only state a signal handler may touch.
std::atomic<int> g_stop_signal{0};    // the first signal
std::atomic<int> g_second_signal{0};  // a later one, past the duplicate window
std::atomic<long long> g_first_at_ns{0};

constexpr int kForwarded[] = {SIGTERM, SIGINT, SIGHUP};

long long monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

// Only notes the signal; the wait loop passes it on (async-signal-safe calls only).
extern "C" void note_signal(int signal) {
  const long long now = monotonic_ns();
  int none = 0;
  if (g_stop_signal.compare_exchange_strong(none, signal))
    g_first_at_ns.store(now);
  else if (now - g_first_at_ns.load() > static_cast<long long>(kSupervisorDuplicateWindowSeconds * 1e9))
    g_second_signal.store(signal);
}

// Installs the handlers for its lifetime.
class NoteSignals {
 public:
  NoteSignals() {
    struct sigaction action {};
    action.sa_handler = note_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &action, &old_[i]);
  }
  ~NoteSignals() {
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

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

JobExit run_supervised(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env,
                       double grace_seconds) {
  SHARDLM_CHECK(!argv.empty(), "internal: no command to run");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  g_stop_signal.store(0);
  g_second_signal.store(0);
  NoteSignals noting;
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  SHARDLM_CHECK(pid >= 0, "cannot fork to start {}: {}", argv[0], std::strerror(errno));
  if (pid == 0) {
    // The job dies with its launcher, however the launcher dies (SIGKILL included).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(1);  // it died before the line above
    for (int s : kForwarded) ::signal(s, SIG_DFL);
    // Signals reach the job through the launcher only (which turns the first into a
    // clean stop); outside the terminal's foreground group it must not read the terminal.
    ::setpgid(0, 0);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "error: cannot run '%s': %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  JobExit result;
  enum class Stage { running, asked_to_stop, terminated, killed } stage = Stage::running;
  Clock::time_point next_step = Clock::time_point::max();
  // Polled (50 times a second): a blocking waitpid could miss a signal that arrives
  // just before it.
  for (;; std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    SHARDLM_CHECK(done == 0 || errno == EINTR, "waiting for {} failed: {}", argv[0],
                  std::strerror(errno));
    if (g_stop_signal == 0) continue;
    if (stage == Stage::running) {
      ::kill(pid, SIGUSR1);
      stage = Stage::asked_to_stop;
      next_step = after(grace_seconds);
    } else if (stage == Stage::asked_to_stop && (g_second_signal != 0 || Clock::now() >= next_step)) {
      ::kill(pid, SIGTERM);
      result.ended = true;
      stage = Stage::terminated;
      next_step = after(kKillAfterTermSeconds);
    } else if (stage == Stage::terminated && Clock::now() >= next_step) {
      ::kill(pid, SIGKILL);  // its ranks notice their parent is gone and exit
      stage = Stage::killed;
    }
  }
  result.status = exit_status(status);
  result.stop_signal = g_stop_signal.load();
  return result;
}

}  // namespace shardlm
