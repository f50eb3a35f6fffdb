#include "shardlm/comm/work.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "shardlm/core/timer.hpp"

namespace shardlm {

std::string describe(const CollectiveInfo& info) {
  switch (info.kind) {
    case CollectiveKind::send:
      return fmt::format("send '{}' (#{} to rank {} on {})", info.label, info.sequence, info.to,
                         info.communicator);
    case CollectiveKind::recv:
      return fmt::format("recv '{}' (#{} from rank {} on {})", info.label, info.sequence,
                         info.from, info.communicator);
    case CollectiveKind::send_recv:
      return fmt::format("send_recv '{}' (#{} to rank {}, #{} from rank {} on {})", info.label,
                         info.sequence, info.to, info.from_sequence, info.from,
                         info.communicator);
    default:
      return fmt::format("{} '{}' (#{} on {})", to_string(info.kind), info.label, info.sequence,
                         info.communicator);
  }
}

namespace detail {

WorkState::WorkState(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
                     std::shared_ptr<const WaitPolicy> policy, uint64_t ticket)
    : info_(std::move(info)),
      counters_(std::move(counters)),
      policy_(std::move(policy)),
      ticket_(ticket) {}

WorkState::WorkState(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
                     std::shared_ptr<const WaitPolicy> policy,
                     std::shared_ptr<CompletionSource> source,
                     std::chrono::steady_clock::time_point issued_at)
    : info_(std::move(info)),
      counters_(std::move(counters)),
      policy_(std::move(policy)),
      ticket_(0),
      source_(std::move(source)) {
  SHARDLM_CHECK(source_ != nullptr && policy_ != nullptr,
                "device-completed {} needs a completion source and a wait policy", describe(info_));
  deadline_ = issued_at + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(policy_->timeout_seconds));
}

std::string WorkState::refresh_locked(std::chrono::steady_clock::time_point now) {
  if (status_ != Status::pending) return {};
  CompletionPoll result = source_->poll();
  if (result.status == CompletionStatus::done) {
    status_ = Status::done;
    if (counters_) counters_->add_seconds(info_.kind, result.seconds);
  } else if (result.status == CompletionStatus::failed) {
    status_ = Status::failed;
    error_ = fmt::format("{}: {} failed: {}", policy_->who, describe(info_), result.error);
    // Handed to a stream (wait_on_stream): no host wait will ever throw this, and the
    // consumer stream would go on with a wrong buffer, so it is reported like a
    // deadline. A host waiter gets it from wait() instead.
    if (observed_) {
      finished_.notify_all();
      return error_;
    }
  } else if (now >= deadline_) {
    status_ = Status::failed;
    timed_out_ = true;
    error_ = fmt::format("{}: {} did not finish within {:g} s", policy_->who, describe(info_),
                         policy_->timeout_seconds);
    return error_;
  } else {
    return {};
  }
  finished_.notify_all();
  return {};
}

// Reports a line refresh_locked returned: a deadline passed, or a collective handed
// to a stream failed. Outside the lock: abandon() may block for a while
// (ncclCommAbort) and on_timeout usually ends the process.
void WorkState::report_timeout(const std::string& line) {
  finished_.notify_all();
  source_->abandon();
  if (policy_->on_timeout) policy_->on_timeout(line);
}

bool WorkState::poll_device(std::chrono::steady_clock::time_point now) {
  SHARDLM_ASSERT(source_ != nullptr);
  std::string timeout_line;
  {
    std::lock_guard lock(mutex_);
    timeout_line = refresh_locked(now);
    if (timeout_line.empty()) return status_ != Status::pending;
  }
  report_timeout(timeout_line);
  return true;
}

bool WorkState::stream_wait(void* stream) {
  if (source_ == nullptr) return false;
  std::lock_guard lock(mutex_);
  if (!source_->stream_wait(stream)) return false;
  observed_ = true;  // completion is now the stream's business; the watchdog still watches
  return true;
}

// Polls until the source settles or the deadline passes, sleeping a little longer
// each round (a collective in flight usually ends within microseconds to
// milliseconds); the watchdog's notify ends a sleep early.
void WorkState::wait_for_device(std::unique_lock<std::mutex>& lock) {
  auto pause = std::chrono::microseconds(5);
  for (;;) {
    const std::string timeout_line = refresh_locked(std::chrono::steady_clock::now());
    if (!timeout_line.empty()) {
      lock.unlock();
      report_timeout(timeout_line);
      lock.lock();
      return;
    }
    if (status_ != Status::pending) return;
    finished_.wait_for(lock, pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

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
  if (source_ != nullptr) {
    wait_for_device(lock);
    observed_ = true;
    if (counters_) counters_->add_exposed_seconds(blocked.seconds());
    if (timed_out_) throw CommTimeout(error_);
    if (status_ == Status::failed) throw Error(error_);
    return;
  }
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
  std::string timeout_line;
  std::unique_lock lock(mutex_);
  if (source_ != nullptr) timeout_line = refresh_locked(std::chrono::steady_clock::now());
  if (!timeout_line.empty()) {
    lock.unlock();
    report_timeout(timeout_line);
    lock.lock();
  }
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

void Work::wait_on_stream(void* stream) {
  if (state_ && state_->stream_wait(stream)) return;
  wait();
}

}  // namespace shardlm
