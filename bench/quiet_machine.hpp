// The benchmarks share this machine with builds and other runs: they read how busy
// the other processes keep it and, before a timing, wait a while for a quiet moment.
#pragma once

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "shardlm/core/timer.hpp"

namespace shardlm::bench {

// CPU time other processes used over a short window, as a fraction of the machine
// (this process is asleep while it looks).
inline double others_busy_fraction() {
  auto sample = [] {
    std::ifstream f("/proc/stat");
    std::string cpu;
    long long v = 0, total = 0, idle = 0;
    f >> cpu;
    for (int k = 0; k < 8 && f >> v; ++k) {
      total += v;
      if (k == 3 || k == 4) idle += v;  // idle, iowait
    }
    return std::pair{total, idle};
  };
  const auto [t0, i0] = sample();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const auto [t1, i1] = sample();
  return t1 > t0 ? 1.0 - static_cast<double>(i1 - i0) / static_cast<double>(t1 - t0) : 0.0;
}

// Waits (up to max_wait seconds) until the other processes use under 10% of the
// machine; whether it got quiet. The wait also lets a previous library's spinning
// threads go to sleep.
inline bool wait_until_quiet(double max_wait) {
  Stopwatch waited;
  while (others_busy_fraction() > 0.10) {
    if (waited.seconds() > max_wait) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return true;
}

// "1-minute 5-minute 15-minute" load averages.
inline std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one, five, fifteen;
  f >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

}  // namespace shardlm::bench
