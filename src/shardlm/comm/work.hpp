// Work: the handle an asynchronous collective returns. wait() blocks until the
// collective has finished, throws if it failed, and never blocks past its deadline.
//
// Two ways a Work completes:
// - host completion (CPU communicators): whoever executed the collective calls
//   WorkState::complete() or fail() (the communication thread);
// - device completion (NCCL): a CompletionSource (an event recorded on the
//   communication stream) is polled by wait(), is_done() and the DeviceWatchdog
//   (device_watchdog.hpp); a consumer stream can be ordered after it with
//   Work::wait_on_stream() without blocking the host. The deadline then counts from
//   the moment the collective was issued, and whoever first sees it pass (a waiter or
//   the watchdog) abandons the device work and reports the collective by name.
#pragma once

#include <chrono>
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
// Point-to-point operations are numbered per pair of ranks instead: `sequence` counts
// this rank's sends to `to` (a recv: its receives from `from`), `from_sequence` a
// send_recv's receives from `from`. Peers are ranks of the communicator.
struct CollectiveInfo {
  CollectiveKind kind = CollectiveKind::barrier;
  std::string label;
  uint64_t sequence = 0;
  std::string communicator = "world";
  int to = -1;    // send, send_recv: the rank sent to
  int from = -1;  // recv, send_recv: the rank received from
  uint64_t from_sequence = 0;  // send_recv: the number of its receive half
};

// "all_reduce 'loss sum' (#7 on world)", "send 'kv step 2' (#2 to rank 1 on context)",
// "send_recv 'kv step 2' (#2 to rank 1, #2 from rank 3 on context)"
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

// What a CompletionSource reports when polled.
enum class CompletionStatus { pending, done, failed };
struct CompletionPoll {
  CompletionStatus status = CompletionStatus::pending;
  std::string error;     // why, when failed
  double seconds = 0.0;  // when done: time the device spent on the collective (counters)
};

// Completion decided by a device rather than by a host thread: for NCCL, an event
// recorded on the communication stream after the collective. Called from several
// threads (waiters, the watchdog), always under the owning WorkState's lock, so an
// implementation needs no locking of its own.
class CompletionSource {
 public:
  virtual ~CompletionSource() = default;
  // Non-blocking: has the device work finished (or failed)?
  virtual CompletionPoll poll() = 0;
  // Makes `stream` (a cudaStream_t) wait for the completion without blocking the
  // host. Returns false if this source cannot order a stream (the caller then waits
  // on the host instead).
  virtual bool stream_wait(void* stream) {
    (void)stream;
    return false;
  }
  // Called once, when the deadline has passed: stop the device work so that no rank
  // hangs on it (NCCL: ncclCommAbort). Runs before WaitPolicy::on_timeout, which in a
  // real job ends the process.
  virtual void abandon() {}
};

namespace detail {

// Shared between the Work handle(s), the communication thread that completes it and
// the communicator's leak check.
class WorkState {
 public:
  WorkState(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
            std::shared_ptr<const WaitPolicy> policy, uint64_t ticket = 0);
  // Device completion: `source` decides; the deadline is issued_at + the policy's
  // timeout. complete()/fail() must not be called on such a state.
  WorkState(CollectiveInfo info, std::shared_ptr<CounterBlock> counters,
            std::shared_ptr<const WaitPolicy> policy, std::shared_ptr<CompletionSource> source,
            std::chrono::steady_clock::time_point issued_at);

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

  // --- device completion only ---
  bool has_completion_source() const { return source_ != nullptr; }
  // Polls the source once and checks the deadline against `now` (the watchdog's
  // sweep). Returns true once the state is settled (done, failed or timed out). When
  // this call is the one that finds the deadline passed, it abandons the device work
  // and calls the policy's on_timeout with "<who>: <collective> did not finish within
  // <timeout> s" before returning; likewise with "<who>: <collective> failed: <why>"
  // for a failure no host wait will report (the Work was handed to a stream).
  bool poll_device(std::chrono::steady_clock::time_point now);
  // Orders `stream` after the collective (see Work::wait_on_stream). Returns false
  // when the source cannot; marks the state observed when it can.
  bool stream_wait(void* stream);

 private:
  enum class Status { pending, done, failed };
  // Under mutex_: polls the source, settles done/failed, or on a passed deadline
  // settles failed with the timeout line and returns that line (to be reported by the
  // caller outside the lock). Empty when no deadline was crossed by this call.
  std::string refresh_locked(std::chrono::steady_clock::time_point now);
  void report_timeout(const std::string& line);
  void wait_for_device(std::unique_lock<std::mutex>& lock);
  const CollectiveInfo info_;
  const std::shared_ptr<CounterBlock> counters_;
  const std::shared_ptr<const WaitPolicy> policy_;
  const uint64_t ticket_;  // position in the communication thread's queue
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  Status status_ = Status::pending;
  std::string error_;
  bool observed_ = false;
  // Device completion (null for host completion).
  const std::shared_ptr<CompletionSource> source_;
  std::chrono::steady_clock::time_point deadline_{};
  bool timed_out_ = false;  // settled failed because the deadline passed
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
  // Orders `stream` (a cudaStream_t, passed as void* so that this header needs no
  // CUDA) after the collective without blocking the host: work launched on `stream`
  // afterwards sees the collective's result (c10d's Work::wait on a stream). The
  // deadline still applies (the DeviceWatchdog keeps watching the collective). A Work
  // completed on the host (CPU communicators, or a finished no-op) has no event to
  // order by: then this is wait().
  void wait_on_stream(void* stream);
  // The collective this handle belongs to; nullptr for a default-constructed Work.
  const CollectiveInfo* info() const { return state_ ? &state_->info() : nullptr; }
  // True once wait() returned or is_done() reported true (see WorkState::observed).
  bool observed() const { return state_ == nullptr || state_->observed(); }

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace shardlm
