// DeviceWatchdog: the thread that enforces deadlines on collectives completed by a
// device (Work with a CompletionSource, work.hpp). Nobody may ever wait for such a
// collective on the host (a consumer stream waits for it instead), so without a
// watchdog a peer that never joins would hang the job silently: this thread polls
// every watched collective, settles the finished ones and, once one is past its
// deadline, abandons it (NCCL: ncclCommAbort) and reports it through
// WaitPolicy::on_timeout: "rank 3: all_gather 'unit h.3' (#41 on world) did not
// finish within 300 s". One per process is enough (NcclCommunicator shares one
// between the world and its sub-communicators).
//
// It knows nothing about CUDA; tests drive it with fake completion sources and, with
// start_thread = false, sweep by hand with an explicit clock (sweep(now)).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "shardlm/comm/work.hpp"

namespace shardlm {

struct DeviceWatchdogOptions {
  // Pause between sweeps. The deadline fires at most this much late.
  double poll_interval_seconds = 0.01;
  // false: no thread; the owner calls sweep() (tests).
  bool start_thread = true;
};

class DeviceWatchdog {
 public:
  explicit DeviceWatchdog(DeviceWatchdogOptions options = {});
  // Stops the thread; collectives still watched are dropped unreported (the owner
  // drains them first: see wait_all()).
  ~DeviceWatchdog();
  DeviceWatchdog(const DeviceWatchdog&) = delete;
  DeviceWatchdog& operator=(const DeviceWatchdog&) = delete;

  // Watches `state` until it settles. States without a completion source are refused.
  void watch(std::shared_ptr<detail::WorkState> state);
  // One pass over every watched collective at time `now`: polls each, forgets settled
  // ones and fires the deadline of those past it. Returns how many remain pending.
  size_t sweep(std::chrono::steady_clock::time_point now);
  size_t pending() const;
  // Blocks until nothing is pending (sweeping itself when there is no thread), or
  // until every watched collective has passed its deadline and been reported.
  // Used at shutdown so that buffers are not freed under a running collective.
  void wait_all();
  void stop();

 private:
  void loop();

  const DeviceWatchdogOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::shared_ptr<detail::WorkState>> watched_;
  size_t in_sweep_ = 0;  // taken out of watched_ by a sweep in progress
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace shardlm
