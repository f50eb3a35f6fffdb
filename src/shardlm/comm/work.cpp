#include "shardlm/comm/work.hpp"

#include <fmt/format.h>

#include <chrono>

#include "shardlm/core/timer.hpp"

namespace shardlm {

std::string describe(const CollectiveInfo& info) {
  return fmt::format("{} '{}' (#{} on {})", to_string(info.kind), info.label, info.sequence,
                     info.communicator);
}

namespace detail {

WorkState::WorkState(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
                     std::shared_ptr<const WaitPolicy> policy, uint64_t ticket)
    : info_(std::move(info)),
      counters_(std::move(counters)),
      policy_(std::move(policy)),
      ticket_(ticket) {}

void WorkState::complete() {
  {
    std::lock_guard lock(mutex_);
    status_ = Status::done;
  }
  finished_.notify_all();
}

void WorkState::fail(std::string message) {
  {
    std::lock_guard lock(mutex_);
    status_ = Status::failed;
    error_ = std::move(message);
  }
  finished_.notify_all();
}

void WorkState::wait() {
  Stopwatch blocked;
  std::unique_lock lock(mutex_);
  if (status_ == Status::pending) {
    // Only while pending: the communication thread is then alive (it drains its queue
    // before it ends). Lock order: this state's mutex, then the thread's.
    if (policy_ && policy_->on_wait) policy_->on_wait(ticket_);
    const double timeout = policy_ ? policy_->timeout_seconds : 0.0;
    const bool finished =
        policy_ == nullptr ||  // nothing will ever complete it: a bug, reported below
        finished_.wait_for(lock, std::chrono::duration<double>(timeout),
                           [&] { return status_ != Status::pending; });
    if (!finished) {
      observed_ = true;  // the caller learns its fate (the deadline): not a leak
      lock.unlock();
      std::string line = fmt::format("{}: timed out after {:.1f} s waiting for {}", policy_->who,
                                     blocked.seconds(), describe(info_));
      if (policy_->describe_activity)
        line += "; communication thread " + policy_->describe_activity();
      if (policy_->on_timeout) policy_->on_timeout(line);
      throw CommTimeout(line);
    }
    SHARDLM_ASSERT(status_ != Status::pending);
  }
  observed_ = true;
  if (counters_) counters_->add_exposed_seconds(blocked.seconds());
  if (status_ == Status::failed) throw Error(error_);
}

bool WorkState::is_done() {
  std::lock_guard lock(mutex_);
  if (status_ == Status::pending) return false;
  observed_ = true;
  return true;
}

bool WorkState::observed() const {
  std::lock_guard lock(mutex_);
  return observed_;
}

}  // namespace detail

void Work::wait() {
  if (state_) state_->wait();
}

bool Work::is_done() const { return state_ == nullptr || state_->is_done(); }

}  // namespace shardlm
