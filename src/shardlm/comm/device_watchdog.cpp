#include "shardlm/comm/device_watchdog.hpp"

#include <fmt/format.h>

namespace shardlm {

DeviceWatchdog::DeviceWatchdog(DeviceWatchdogOptions options) : options_(options) {
  SHARDLM_CHECK(options.poll_interval_seconds > 0, "watchdog poll interval must be positive, got {}",
                options.poll_interval_seconds);
  if (options_.start_thread) thread_ = std::thread([this] { loop(); });
}

DeviceWatchdog::~DeviceWatchdog() { stop(); }

void DeviceWatchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DeviceWatchdog::watch(std::shared_ptr<detail::WorkState> state) {
  SHARDLM_CHECK(state != nullptr && state->has_completion_source(),
                "the device watchdog only watches device-completed collectives");
  {
    std::lock_guard lock(mutex_);
    watched_.push_back(std::move(state));
  }
  changed_.notify_all();
}

size_t DeviceWatchdog::sweep(std::chrono::steady_clock::time_point now) {
  // Poll outside the watchdog's lock: a deadline's report may take long (the abort)
  // or never return (it ends the process), and watch() must not block meanwhile.
  std::vector<std::shared_ptr<detail::WorkState>> batch;
  {
    std::lock_guard lock(mutex_);
    batch.swap(watched_);
    in_sweep_ += batch.size();
  }
  std::vector<std::shared_ptr<detail::WorkState>> still_pending;
  for (auto& state : batch)
    if (!state->poll_device(now)) still_pending.push_back(std::move(state));
  size_t remaining = 0;
  {
    std::lock_guard lock(mutex_);
    in_sweep_ -= batch.size();
    // Issue order is kept: what was watched during the sweep goes after the older ones.
    still_pending.insert(still_pending.end(), std::make_move_iterator(watched_.begin()),
                         std::make_move_iterator(watched_.end()));
    watched_.swap(still_pending);
    remaining = watched_.size() + in_sweep_;
  }
  changed_.notify_all();
  return remaining;
}

size_t DeviceWatchdog::pending() const {
  std::lock_guard lock(mutex_);
  return watched_.size() + in_sweep_;
}

void DeviceWatchdog::wait_all() {
  // Every watched state settles by its deadline at the latest (sweeps fire it), so
  // this loop ends.
  for (;;) {
    if (!options_.start_thread) {
      if (sweep(std::chrono::steady_clock::now()) == 0) return;
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_interval_seconds));
      continue;
    }
    std::unique_lock lock(mutex_);
    if ((watched_.empty() && in_sweep_ == 0) || stopping_) return;
    changed_.wait_for(lock, std::chrono::duration<double>(options_.poll_interval_seconds));
  }
}

void DeviceWatchdog::loop() {
  const auto interval = std::chrono::duration<double>(options_.poll_interval_seconds);
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !watched_.empty(); });
    // One pause before each sweep: a collective just issued is rarely done at once.
    changed_.wait_for(lock, interval, [&] { return stopping_; });
    if (stopping_) return;
    lock.unlock();
    sweep(std::chrono::steady_clock::now());
    lock.lock();
  }
}

}  // namespace shardlm
