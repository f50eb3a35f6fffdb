#include "shardlm/train/stop_signals.hpp"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "shardlm/core/fault_injection.hpp"

namespace shardlm {

namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};

std::atomic<int> g_first_signal{0};
std::atomic<long long> g_first_signal_ns{0};
std::atomic<bool> g_announce{false};

static_assert(std::atomic<int>::is_always_lock_free && std::atomic<long long>::is_always_lock_free,
              "signal handlers may only touch lock-free atomics");

long long monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

// On stdout, the stream of rank 0's other lines (the summary and the stop line after
// it): mpirun forwards a rank's stdout and stderr through separate pipes and does not
// keep their order, so a stderr line could land inside a later stdout line.
void say(const char* text) {
  if (g_announce.load()) (void)!::write(STDOUT_FILENO, text, ::strlen(text));
}

// Only async-signal-safe calls: atomics, clock_gettime, write, signal, raise.
extern "C" void on_stop_signal(int signal) {
  const long long now = monotonic_ns();
  int expected = 0;
  if (g_first_signal.compare_exchange_strong(expected, signal)) {
    g_first_signal_ns.store(now);
    say(signal == SIGUSR1 ? "received SIGUSR1: stopping after this step with a checkpoint "
                            "(a second signal stops at once)\n"
        : signal == SIGINT ? "received SIGINT: stopping after this step with a checkpoint "
                             "(a second signal stops at once)\n"
                           : "received SIGTERM: stopping after this step with a checkpoint "
                             "(a second signal stops at once)\n");
    return;
  }
  if (now - g_first_signal_ns.load() < static_cast<long long>(kDuplicateWindowSeconds * 1e9))
    return;  // the same request, delivered again by another path
  say("second signal: stopping at once, without a checkpoint (the last one written is kept)\n");
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace

void install_stop_signal_handlers() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    for (int s : kStopSignals) sigaddset(&stop_signals, s);
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    action.sa_mask = stop_signals;  // one handler at a time
    action.sa_flags = SA_RESTART;
    for (int s : kStopSignals) ::sigaction(s, &action, nullptr);
    // The receiving thread keeps the signals unblocked (it starts before the block
    // below) and only waits; threads started before this call (OpenBLAS's pool at
    // load time) may receive them too, while idle.
    std::thread([] {
      for (;;) ::pause();
    }).detach();
    ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  });
}

void announce_stop_signals(bool announce) { g_announce.store(announce); }

int stop_signal_received() { return g_first_signal.load(); }

void hold_for_stop_signal_if_asked(int rank, int64_t steps_done) {
  const auto spec = fault_value("hold_for_signal");
  if (!spec) return;
  int hold_rank = -1;
  long long hold_step = -1;
  if (std::sscanf(spec->c_str(), "%d:%lld", &hold_rank, &hold_step) != 2 || hold_rank != rank ||
      hold_step != steps_done)
    return;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(kHoldForSignalSeconds);
  while (stop_signal_received() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(signal);
  }
}

}  // namespace shardlm
