// Device completion without a device: Works completed by a CompletionSource and the
// DeviceWatchdog that enforces their deadlines, driven by fake sources (an "event"
// the test finishes, fails or never finishes) and, where the deadline matters, by an
// explicit clock (sweep(now)) instead of real time.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "shardlm/comm/device_watchdog.hpp"
#include "shardlm/comm/work.hpp"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

// An event the test controls. poll() is called under the WorkState's lock; the test
// flips it through a mutex of its own because it runs on another thread than the
// watchdog's.
class FakeEvent final : public CompletionSource {
 public:
  void finish(double seconds) {
    std::lock_guard lock(mutex_);
    result_.status = CompletionStatus::done;
    result_.seconds = seconds;
  }
  void break_with(std::string error) {
    std::lock_guard lock(mutex_);
    result_.status = CompletionStatus::failed;
    result_.error = std::move(error);
  }
  CompletionPoll poll() override {
    std::lock_guard lock(mutex_);
    ++polls_;
    return result_;
  }
  bool stream_wait(void* stream) override {
    std::lock_guard lock(mutex_);
    waiting_streams_.push_back(stream);
    return true;
  }
  void abandon() override {
    std::lock_guard lock(mutex_);
    ++abandoned_;
  }
  int abandoned() const {
    std::lock_guard lock(mutex_);
    return abandoned_;
  }
  int polls() const {
    std::lock_guard lock(mutex_);
    return polls_;
  }
  std::vector<void*> waiting_streams() const {
    std::lock_guard lock(mutex_);
    return waiting_streams_;
  }

 private:
  mutable std::mutex mutex_;
  CompletionPoll result_;
  int abandoned_ = 0;
  int polls_ = 0;
  std::vector<void*> waiting_streams_;
};

// Records on_timeout lines; lets a test wait (with a bound) for the first one.
class TimeoutLog {
 public:
  void add(const std::string& line) {
    {
      std::lock_guard lock(mutex_);
      lines_.push_back(line);
    }
    cv_.notify_all();
  }
  std::vector<std::string> lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  // Bounded, so a broken watchdog fails the test instead of hanging it.
  bool wait_for_first(std::chrono::seconds bound) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, bound, [&] { return !lines_.empty(); });
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

std::shared_ptr<const WaitPolicy> policy(double timeout, TimeoutLog* log) {
  WaitPolicy p;
  p.who = "rank 3";
  p.timeout_seconds = timeout;
  p.on_timeout = [log](const std::string& line) { log->add(line); };
  return std::make_shared<const WaitPolicy>(std::move(p));
}

CollectiveInfo unit_h3() { return CollectiveInfo{CollectiveKind::all_gather, "unit h.3", 41, "world"}; }

struct DeviceWork {
  std::shared_ptr<FakeEvent> event = std::make_shared<FakeEvent>();
  std::shared_ptr<CounterBlock> counters = std::make_shared<CounterBlock>();
  std::shared_ptr<detail::WorkState> state;
  Work work;
  DeviceWork(std::shared_ptr<const WaitPolicy> p, Clock::time_point issued_at,
             CollectiveInfo info = unit_h3()) {
    state = std::make_shared<detail::WorkState>(std::move(info), counters, std::move(p), event,
                                                issued_at);
    work = Work(state);
  }
};

DeviceWatchdogOptions manual() {
  DeviceWatchdogOptions o;
  o.start_thread = false;
  return o;
}

TEST(DeviceWatchdog, NeverFinishingEventFiresTheTimeoutNamingTheCollectiveAtItsDeadline) {
  TimeoutLog log;
  const Clock::time_point t0 = Clock::now();
  DeviceWork dw(policy(300, &log), t0);
  DeviceWatchdog watchdog(manual());
  watchdog.watch(dw.state);

  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(299)), 1u);
  EXPECT_TRUE(log.lines().empty());
  EXPECT_EQ(dw.event->abandoned(), 0);

  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(300)), 0u);
  const std::string expected =
      "rank 3: all_gather 'unit h.3' (#41 on world) did not finish within 300 s";
  ASSERT_EQ(log.lines(), std::vector<std::string>{expected});
  EXPECT_EQ(dw.event->abandoned(), 1);  // the communicator is aborted: no rank hangs

  // The waiter learns the same line; nothing fires twice.
  try {
    dw.work.wait();
    FAIL() << "wait() returned for a collective past its deadline";
  } catch (const CommTimeout& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
  EXPECT_TRUE(dw.work.observed());
  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(900)), 0u);
  EXPECT_EQ(log.lines().size(), 1u);
  EXPECT_EQ(dw.event->abandoned(), 1);
}

TEST(DeviceWatchdog, FinishedEventIsReportedDoneAndCountsItsDeviceSeconds) {
  TimeoutLog log;
  const Clock::time_point t0 = Clock::now();
  DeviceWork dw(policy(300, &log), t0);
  DeviceWatchdog watchdog(manual());
  watchdog.watch(dw.state);
  EXPECT_EQ(watchdog.sweep(t0), 1u);
  EXPECT_FALSE(dw.work.observed());

  dw.event->finish(0.25);
  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(1)), 0u);
  EXPECT_FALSE(dw.work.observed());  // the watchdog settles it; the caller has not seen it yet
  EXPECT_TRUE(dw.work.is_done());
  EXPECT_TRUE(dw.work.observed());
  dw.work.wait();
  // Long past the deadline now: a settled collective never times out.
  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(1000)), 0u);
  EXPECT_TRUE(log.lines().empty());
  EXPECT_EQ(dw.event->abandoned(), 0);
  const CommCounters counters = dw.counters->snapshot();
  EXPECT_EQ(counters[CollectiveKind::all_gather].seconds, 0.25);
}

TEST(DeviceWatchdog, FailedEventPropagatesItsMessageToTheWaiter) {
  TimeoutLog log;
  const Clock::time_point t0 = Clock::now();
  DeviceWork dw(policy(300, &log), t0);
  DeviceWatchdog watchdog(manual());
  watchdog.watch(dw.state);
  dw.event->break_with("NCCL error 'unhandled cuda error' (ncclUnhandledCudaError)");
  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(1)), 0u);
  try {
    dw.work.wait();
    FAIL() << "wait() returned for a failed collective";
  } catch (const CommTimeout&) {
    FAIL() << "a failure was reported as a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "rank 3: all_gather 'unit h.3' (#41 on world) failed: NCCL error 'unhandled cuda "
              "error' (ncclUnhandledCudaError)");
  }
  EXPECT_TRUE(log.lines().empty());
  EXPECT_EQ(dw.event->abandoned(), 0);
}

TEST(DeviceWatchdog, IsDoneAndWaitPollTheEventWithoutAWatchdog) {
  TimeoutLog log;
  DeviceWork dw(policy(300, &log), Clock::now());
  EXPECT_FALSE(dw.work.is_done());
  EXPECT_FALSE(dw.work.observed());
  const int polls = dw.event->polls();
  EXPECT_GE(polls, 1);
  dw.event->finish(0.0);
  dw.work.wait();  // returns at once: the event is done
  EXPECT_TRUE(dw.work.observed());
  EXPECT_TRUE(log.lines().empty());
}

TEST(DeviceWatchdog, ThreadFiresTheDeadlineOfACollectiveNobodyWaitsFor) {
  // Real time, short deadline: the thread alone must notice (no wait(), no is_done()).
  TimeoutLog log;
  DeviceWork dw(policy(0.05, &log), Clock::now(),
                CollectiveInfo{CollectiveKind::reduce_scatter, "grads b.0", 7, "shard"});
  DeviceWork finished(policy(0.05, &log), Clock::now());
  finished.event->finish(0.0);
  DeviceWatchdogOptions options;
  options.poll_interval_seconds = 0.005;
  DeviceWatchdog watchdog(options);
  watchdog.watch(finished.state);
  watchdog.watch(dw.state);
  ASSERT_TRUE(log.wait_for_first(std::chrono::seconds(60)));
  watchdog.wait_all();
  EXPECT_EQ(watchdog.pending(), 0u);
  EXPECT_EQ(log.lines(), std::vector<std::string>{
                             "rank 3: reduce_scatter 'grads b.0' (#7 on shard) did not finish "
                             "within 0.05 s"});
  EXPECT_EQ(dw.event->abandoned(), 1);
  EXPECT_THROW(dw.work.wait(), CommTimeout);
  finished.work.wait();
}

TEST(DeviceWatchdog, WaitingPastTheDeadlineFiresTheSameLineOnce) {
  // No watchdog at all: wait() enforces the deadline itself, with the same report.
  TimeoutLog log;
  DeviceWork dw(policy(0.02, &log), Clock::now());
  EXPECT_THROW(dw.work.wait(), CommTimeout);
  EXPECT_EQ(log.lines(), std::vector<std::string>{
                             "rank 3: all_gather 'unit h.3' (#41 on world) did not finish within "
                             "0.02 s"});
  EXPECT_EQ(dw.event->abandoned(), 1);
  EXPECT_THROW(dw.work.wait(), CommTimeout);
  EXPECT_EQ(log.lines().size(), 1u);
}

TEST(DeviceWatchdog, WaitOnStreamOrdersTheStreamAndLeavesTheDeadlineToTheWatchdog) {
  TimeoutLog log;
  const Clock::time_point t0 = Clock::now();
  DeviceWork dw(policy(300, &log), t0);
  DeviceWatchdog watchdog(manual());
  watchdog.watch(dw.state);
  int stream_token = 0;  // any address stands for a cudaStream_t here
  dw.work.wait_on_stream(&stream_token);
  EXPECT_EQ(dw.event->waiting_streams(), std::vector<void*>{&stream_token});
  EXPECT_TRUE(dw.work.observed());  // handed to the stream: not a leak
  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(301)), 0u);
  EXPECT_EQ(log.lines().size(), 1u);  // still enforced
}

TEST(DeviceWatchdog, FailureOfACollectiveHandedToAStreamIsReportedAndAborts) {
  // Nobody will wait on the host: the failure must not pass silently.
  TimeoutLog log;
  const Clock::time_point t0 = Clock::now();
  DeviceWork dw(policy(300, &log), t0);
  DeviceWatchdog watchdog(manual());
  watchdog.watch(dw.state);
  int stream_token = 0;
  dw.work.wait_on_stream(&stream_token);
  dw.event->break_with("NCCL error: remote process exited");
  EXPECT_EQ(watchdog.sweep(t0 + std::chrono::seconds(1)), 0u);
  EXPECT_EQ(log.lines(), std::vector<std::string>{
                             "rank 3: all_gather 'unit h.3' (#41 on world) failed: NCCL error: "
                             "remote process exited"});
  EXPECT_EQ(dw.event->abandoned(), 1);
  EXPECT_THROW(dw.work.wait(), Error);
  EXPECT_EQ(log.lines().size(), 1u);
}

TEST(DeviceWatchdog, HostCompletedWorkOnAStreamIsAHostWait) {
  auto p = std::make_shared<const WaitPolicy>();
  auto state = std::make_shared<detail::WorkState>(unit_h3(), nullptr, p);
  state->complete();
  Work work(state);
  int stream_token = 0;
  work.wait_on_stream(&stream_token);
  EXPECT_TRUE(work.observed());
  Work().wait_on_stream(&stream_token);  // a finished no-op
}

TEST(DeviceWatchdog, RefusesHostCompletedWork) {
  DeviceWatchdog watchdog(manual());
  auto state = std::make_shared<detail::WorkState>(unit_h3(), nullptr,
                                                   std::make_shared<const WaitPolicy>());
  EXPECT_THROW(watchdog.watch(state), Error);
}

}  // namespace
}  // namespace shardlm
