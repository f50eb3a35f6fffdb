// CommThread: one thread that executes queued collectives strictly in the order they
// were submitted. With MPI it is the only thread that calls MPI, so the compute
// thread can queue a gradient reduction and keep computing while it travels.
//
// It knows nothing about MPI: a collective is a function to run. The MPI
// communicator supplies those functions; tests supply fakes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "shardlm/comm/work.hpp"

namespace shardlm {

// When collectives start.
enum class CommStart {
  // As soon as they reach the front of the queue, overlapping with whatever the
  // compute thread does next (the point of the thread).
  at_once,
  // Only once some thread waits for them or for a later one. No overlap: while a
  // collective runs the compute thread is blocked, so MPI's busy-polling never
  // competes with computation for cores (docs/communication.md, "Overlap").
  on_wait,
};

class CommThread {
 public:
  // `policy` decides what a wait (and the drain at shutdown) does when its deadline
  // passes; its describe_activity and on_wait are filled in here.
  explicit CommThread(WaitPolicy policy, CommStart start = CommStart::at_once);
  // Shuts down if shutdown() was not called (errors are printed, not thrown).
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `run` behind everything submitted before. `run` throws to report failure;
  // the returned Work then throws "<who>: <collective> failed: <what>" from wait().
  // Seconds spent in `run` are added to `counters` under info.kind.
  Work submit(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
              std::function<void()> run);

  // Runs everything still queued (waiting at most the deadline, then on_timeout),
  // stops the thread and joins it. Idempotent.
  void shutdown();

  const std::shared_ptr<const WaitPolicy>& policy() const { return policy_; }
  // "busy for 2.0 s in all_reduce 'x' (#3 on world), 2 more queued" or "idle".
  std::string describe_activity() const;

 private:
  void release_through(uint64_t ticket);

  struct Task {
    std::shared_ptr<detail::WorkState> state;
    std::shared_ptr<CounterBlock> counters;
    std::function<void()> run;
  };
  void loop();

  std::shared_ptr<const WaitPolicy> policy_;
  const CommStart start_;
  mutable std::mutex mutex_;
  uint64_t next_ticket_ = 0;
  uint64_t released_end_ = 0;  // tasks with ticket < released_end_ may start
  std::condition_variable queue_changed_;
  std::deque<Task> queue_;
  bool running_task_ = false;
  CollectiveInfo current_;
  std::chrono::steady_clock::time_point current_start_;
  bool stopping_ = false;
  bool joined_ = false;
  std::thread thread_;
};

}  // namespace shardlm
