// The communication thread without MPI: order, failures, deadlines, counters, drain.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "shardlm/comm/comm_thread.hpp"

namespace shardlm {
namespace {

// A gate a fake collective blocks on until the test opens it.
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

WaitPolicy test_policy(double timeout, std::vector<std::string>* timeouts = nullptr) {
  WaitPolicy policy;
  policy.who = "rank 3";
  policy.timeout_seconds = timeout;
  policy.on_timeout = [timeouts](const std::string& line) {
    if (timeouts) timeouts->push_back(line);
  };
  return policy;
}

CollectiveInfo info(CollectiveKind kind, std::string label, uint64_t sequence) {
  return CollectiveInfo{kind, std::move(label), sequence, "world"};
}

TEST(CommThread, RunsCollectivesInSubmissionOrder) {
  CommThread thread(test_policy(30));
  std::vector<int> order;  // written by the comm thread only
  std::vector<Work> works;
  for (int i = 0; i < 20; ++i)
    works.push_back(thread.submit(info(CollectiveKind::all_reduce, "bucket", i), nullptr,
                                  [&order, i] { order.push_back(i); }));
  for (auto& w : works) w.wait();
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
}

TEST(CommThread, ComputeThreadKeepsWorkingWhileACollectiveRuns) {
  CommThread thread(test_policy(30));
  Gate gate;
  Work work =
      thread.submit(info(CollectiveKind::all_reduce, "slow", 0), nullptr, [&] { gate.pass(); });
  EXPECT_FALSE(work.is_done());  // submit returned while the collective is still blocked
  gate.open();
  work.wait();
  EXPECT_TRUE(work.is_done());
}

TEST(CommThread, StartOnWaitRunsCollectivesOnlyOnceWaitedForInOrder) {
  CommThread thread(test_policy(30), CommStart::on_wait);
  std::atomic<int> ran{0};
  std::vector<Work> works;
  for (int i = 0; i < 3; ++i)
    works.push_back(thread.submit(info(CollectiveKind::all_reduce, "bucket", i), nullptr,
                                  [&ran, i] { EXPECT_EQ(ran++, i); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ran.load(), 0);  // nobody waited yet
  works[1].wait();           // releases #0 and #1, in order
  EXPECT_EQ(ran.load(), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ran.load(), 2);
  EXPECT_FALSE(works[2].is_done());  // polling does not start it
  thread.shutdown();                 // the drain runs what is left
  EXPECT_EQ(ran.load(), 3);
  EXPECT_TRUE(works[2].is_done());
  works[0].wait();
}

TEST(CommThread, FailureIsThrownFromWaitNamingRankAndCollective) {
  CommThread thread(test_policy(30));
  Work work = thread.submit(info(CollectiveKind::reduce_scatter, "reduce_scatter unit h.3", 5),
                            nullptr, [] { throw Error("MPI_Waitall failed: truncated"); });
  try {
    work.wait();
    FAIL() << "wait() should throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "rank 3: reduce_scatter 'reduce_scatter unit h.3' (#5 on world) failed: "
                 "MPI_Waitall failed: truncated");
  }
  // Later collectives still run.
  bool ran = false;
  thread.submit(info(CollectiveKind::barrier, "after", 6), nullptr, [&] { ran = true; }).wait();
  EXPECT_TRUE(ran);
}

TEST(CommThread, WaitPastDeadlineReportsRankLabelAndWhatTheThreadIsStuckIn) {
  std::vector<std::string> timeouts;
  CommThread thread(test_policy(0.2, &timeouts));
  Gate gate;
  Work stuck = thread.submit(info(CollectiveKind::all_reduce, "gradients bucket 0", 7), nullptr,
                             [&] { gate.pass(); });
  Work behind =
      thread.submit(info(CollectiveKind::all_gather, "params unit h.1", 8), nullptr, [] {});
  try {
    behind.wait();
    FAIL() << "wait() should time out";
  } catch (const CommTimeout& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 3: timed out after 0."), std::string::npos) << message;
    EXPECT_NE(message.find("waiting for all_gather 'params unit h.1' (#8 on world)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("busy for"), std::string::npos) << message;
    EXPECT_NE(message.find("in all_reduce 'gradients bucket 0' (#7 on world), 1 more queued"),
              std::string::npos)
        << message;
  }
  ASSERT_EQ(timeouts.size(), 1u);  // the policy saw the same line before the throw
  gate.open();
  stuck.wait();
  behind.wait();
}

TEST(CommThread, CountsSecondsPerKindAndExposedWaitTime) {
  CommThread thread(test_policy(30));
  auto counters = std::make_shared<CounterBlock>();
  thread
      .submit(info(CollectiveKind::reduce_scatter, "rs", 0), counters,
              [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); })
      .wait();
  const CommCounters c = counters->snapshot();
  EXPECT_GT(c[CollectiveKind::reduce_scatter].seconds, 0.0);
  EXPECT_EQ(c[CollectiveKind::all_reduce].seconds, 0.0);
  EXPECT_GT(c.exposed_seconds, 0.0);  // the wait blocked on the sleeping collective
}

TEST(CommThread, ShutdownRunsEverythingQueuedThenRefusesNewWork) {
  auto thread = std::make_unique<CommThread>(test_policy(30));
  std::atomic<int> ran{0};
  for (int i = 0; i < 5; ++i)
    thread->submit(info(CollectiveKind::barrier, "b", i), nullptr, [&] { ++ran; });
  thread->shutdown();
  EXPECT_EQ(ran.load(), 5);
  EXPECT_THROW(thread->submit(info(CollectiveKind::barrier, "late", 5), nullptr, [] {}), Error);
  thread->shutdown();  // idempotent
}

TEST(CommThread, ShutdownDrainIsBoundedByTheDeadline) {
  std::vector<std::string> timeouts;
  CommThread thread(test_policy(0.2, &timeouts));
  Gate gate;
  Work stuck =
      thread.submit(info(CollectiveKind::broadcast, "config", 0), nullptr, [&] { gate.pass(); });
  EXPECT_THROW(thread.shutdown(), CommTimeout);
  ASSERT_EQ(timeouts.size(), 1u);
  EXPECT_NE(timeouts[0].find("at shutdown"), std::string::npos) << timeouts[0];
  EXPECT_NE(timeouts[0].find("broadcast 'config'"), std::string::npos) << timeouts[0];
  gate.open();
  stuck.wait();
}

}  // namespace
}  // namespace shardlm
