// Work: the handle an asynchronous collective returns. wait() blocks until the
// collective has finished, throws if it failed, and never blocks past its deadline.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "shardlm/comm/counters.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {

// What a collective is, for messages: kind, the caller's label ("reduce_scatter unit
// h.3"), its sequence number on its communicator, and that communicator's name.
struct CollectiveInfo {
  CollectiveKind kind = CollectiveKind::barrier;
  std::string label;
  uint64_t sequence = 0;
  std::string communicator = "world";
};

// "all_reduce 'loss sum' (#7 on world)"
std::string describe(const CollectiveInfo& info);

// What a wait does when its deadline passes.
struct WaitPolicy {
  std::string who = "rank 0";  // names this process in messages
  double timeout_seconds = 300.0;
  // Called on the waiting thread with one line naming the rank, the collective and
  // the time waited. The MPI communicator prints it and aborts the job (it never
  // returns); if it does return, wait() throws CommTimeout carrying the line.
  std::function<void(const std::string& line)> on_timeout;
  // What the communication thread is busy with right now (added to the line).
  std::function<std::string()> describe_activity;
  // Called with the Work's ticket when a wait begins (the communication thread's
  // start-on-wait mode starts queued collectives up to that ticket).
  std::function<void(uint64_t ticket)> on_wait;
};

class CommTimeout : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Shared between the Work handle(s), the communication thread that completes it and
// the communicator's leak check.
class WorkState {
 public:
  WorkState(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
            std::shared_ptr<const WaitPolicy> policy, uint64_t ticket = 0);

  const CollectiveInfo& info() const { return info_; }
  uint64_t ticket() const { return ticket_; }

  // Called once by whoever executed the collective.
  void complete();
  void fail(std::string message);

  void wait();
  bool is_done();
  // True once wait() returned or is_done() reported true: the caller has seen the
  // result. Collectives never observed by shutdown are reported as leaks.
  bool observed() const;

 private:
  enum class Status { pending, done, failed };
  const CollectiveInfo info_;
  const std::shared_ptr<CounterBlock> counters_;
  const std::shared_ptr<const WaitPolicy> policy_;
  const uint64_t ticket_;  // position in the communication thread's queue
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  Status status_ = Status::pending;
  std::string error_;
  bool observed_ = false;
};

}  // namespace detail

class Work {
 public:
  // A finished no-op (for example the result of a collective on zero elements that
  // needs no communication).
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  // Blocks until the collective has finished. Throws shardlm::Error if it failed;
  // on deadline, see WaitPolicy::on_timeout. Time spent blocked here is counted as
  // the communicator's exposed_seconds. Waiting again returns (or throws) at once.
  void wait();
  bool is_done() const;
  // The collective this handle belongs to; nullptr for a default-constructed Work.
  const CollectiveInfo* info() const { return state_ ? &state_->info() : nullptr; }
  // True once wait() returned or is_done() reported true (see WorkState::observed).
  bool observed() const { return state_ == nullptr || state_->observed(); }

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace shardlm
