#include "shardlm/comm/comm_thread.hpp"

#include <fmt/format.h>

#include <cstdio>

#include "shardlm/core/timer.hpp"

namespace shardlm {

CommThread::CommThread(WaitPolicy policy, CommStart start) : start_(start) {
  // Work handles may outlive this object, but they only ask for the activity while
  // they are pending, and nothing is pending once shutdown() has drained the queue.
  policy.describe_activity = [this] { return describe_activity(); };
  policy.on_wait = [this](uint64_t ticket) { release_through(ticket); };
  policy_ = std::make_shared<const WaitPolicy>(std::move(policy));
  thread_ = std::thread([this] { loop(); });
}

CommThread::~CommThread() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  // Only reachable when a drain timed out and on_timeout returned (tests): wait for
  // the stuck task rather than destroy state it still uses.
  if (thread_.joinable()) thread_.join();
}

Work CommThread::submit(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
                        std::function<void()> run) {
  std::shared_ptr<detail::WorkState> state;
  {
    std::lock_guard lock(mutex_);
    SHARDLM_CHECK(!stopping_, "{}: {} submitted after the communicator was shut down", policy_->who,
                  describe(info));
    const uint64_t ticket = next_ticket_++;
    state = std::make_shared<detail::WorkState>(std::move(info), counters, policy_, ticket);
    if (start_ == CommStart::at_once) released_end_ = next_ticket_;
    queue_.push_back(Task{state, std::move(counters), std::move(run)});
  }
  queue_changed_.notify_all();
  return Work(state);
}

void CommThread::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queue_changed_.wait(lock, [&] {
      return (stopping_ && queue_.empty()) ||
             (!queue_.empty() && queue_.front().state->ticket() < released_end_);
    });
    if (queue_.empty()) return;  // stopping and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    running_task_ = true;
    current_ = task.state->info();
    current_start_ = std::chrono::steady_clock::now();
    lock.unlock();

    Stopwatch elapsed;
    std::string error;
    try {
      task.run();
    } catch (const std::exception& e) {
      error =
          fmt::format("{}: {} failed: {}", policy_->who, describe(task.state->info()), e.what());
    }
    // Counters first, so a caller that returns from wait() sees this collective's time.
    if (task.counters) task.counters->add_seconds(task.state->info().kind, elapsed.seconds());
    if (error.empty())
      task.state->complete();
    else
      task.state->fail(std::move(error));

    lock.lock();
    running_task_ = false;
    queue_changed_.notify_all();
  }
}

void CommThread::release_through(uint64_t ticket) {
  {
    std::lock_guard lock(mutex_);
    if (ticket < released_end_) return;
    released_end_ = ticket + 1;
  }
  queue_changed_.notify_all();
}

void CommThread::shutdown() {
  std::unique_lock lock(mutex_);
  if (joined_) return;
  stopping_ = true;
  released_end_ = next_ticket_;  // whatever is still queued runs now
  queue_changed_.notify_all();
  Stopwatch draining;
  const bool drained =
      queue_changed_.wait_for(lock, std::chrono::duration<double>(policy_->timeout_seconds),
                              [&] { return queue_.empty() && !running_task_; });
  lock.unlock();
  if (!drained) {
    std::string line = fmt::format(
        "{}: timed out after {:.1f} s finishing queued collectives at shutdown; "
        "communication thread {}",
        policy_->who, draining.seconds(), describe_activity());
    if (policy_->on_timeout) policy_->on_timeout(line);
    throw CommTimeout(line);
  }
  thread_.join();
  lock.lock();
  joined_ = true;
}

std::string CommThread::describe_activity() const {
  std::lock_guard lock(mutex_);
  if (!running_task_) return fmt::format("idle, {} queued", queue_.size());
  const double busy =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - current_start_).count();
  return fmt::format("busy for {:.1f} s in {}, {} more queued", busy, describe(current_),
                     queue_.size());
}

}  // namespace shardlm
