// InProcessCommunicator: the N ranks of one job as N threads of this process (like
// c10d's threaded fake process group), so what runs above a Communicator (strategies,
// checkpoints) gets fast unit tests without processes or MPI.
//
// Same interface, argument checks, sequence numbers, labels, counters and deadlines
// as the MPI communicator. A collective completes when the last rank issues it: that
// rank's thread performs it for every rank. Every collective is checked for agreement
// (sequence, kind, bytes, root, operator, dtype, label) across the ranks, as
// CommOptions::check_sequence does under MPI, and fails on every rank with the same
// "out of step" line when they disagree; an all_to_all_v also when what a rank sends
// another differs from what that one expects. Reductions go through
// reduce_kernels.hpp in rank order, so results are bitwise what the MPI communicator
// computes.
//
// A point-to-point half (a send, a recv, either half of a send_recv) completes when
// its peer posts the matching other half (same pair, same per-pair number); the one
// that arrives second copies the message. Matched halves that disagree on label,
// bytes or dtype fail both operations with one "out of step" line. Unlike under MPI
// and NCCL, a rank's operations do not wait for its earlier ones, so a ring of
// separate sends and receives that would block there completes here: test rings with
// send_recv, as real code must use them.
//
// A wait past its deadline throws CommTimeout naming the rank and the collective (no
// process is aborted). abort_job() ends the whole job as MPI_Abort would: every
// pending and later collective of every rank fails with its line, and the calling
// thread throws JobAborted.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/comm/communicator.hpp"

namespace shardlm {

// Thrown by InProcessCommunicator::abort_job on the thread that called it.
class JobAborted : public Error {
 public:
  using Error::Error;
};

// A fault injected into one collective of one rank: the first collective that rank
// issues on communicator `communicator` with label `label`.
struct InProcessFault {
  enum class Kind {
    never_arrives,  // the rank issues it but its contribution is lost: every rank's wait
                    // (its own too) runs into the deadline
    fails,          // it fails on every rank with "rank R: <collective> failed: <message>"
  };
  int rank = 0;  // in the whole job
  std::string label;
  Kind kind = Kind::never_arrives;
  std::string message = "injected failure";
  std::string communicator = "world";
};

class InProcessJob;

class InProcessCommunicator final : public Communicator {
 public:
  ~InProcessCommunicator() override;

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  // Fails every pending and later collective of the job with "rank R: message" and
  // throws JobAborted carrying that line.
  [[noreturn]] void abort_job(const std::string& message) override;

  struct Group;  // the ranks of one communicator and their pending collectives

 protected:
  Work start_all_reduce(float* data, size_t count, ReduceOp op, const Collective& c) override;
  Work start_reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op,
                            WireType wire, const Collective& c) override;
  Work start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                        const Collective& c) override;
  Work start_broadcast(void* data, size_t bytes, int root, const Collective& c) override;
  Work start_barrier(const Collective& c) override;
  Work start_all_to_all(ConstTypedPtr send, TypedPtr recv, const AllToAllCounts& counts,
                        const Collective& c) override;
  Work start_point_to_point(const PointToPoint& p, const Collective& c) override;
  std::string who() const override;

 private:
  friend class InProcessJob;
  struct Contribution;
  InProcessCommunicator(std::shared_ptr<Group> group, int rank, int world_rank,
                        CommOptions options);
  Work post(Contribution contribution);

  std::shared_ptr<Group> group_;
  const int world_rank_;
  std::shared_ptr<const WaitPolicy> policy_;
  uint64_t splits_ = 0;  // splits this rank has issued (they pair up across ranks in order)
};

// One simulated job of `size` ranks.
class InProcessJob {
 public:
  explicit InProcessJob(int size, CommOptions options = {});
  ~InProcessJob();
  InProcessJob(const InProcessJob&) = delete;
  InProcessJob& operator=(const InProcessJob&) = delete;

  int size() const;
  // Rank `rank`'s world communicator (once per rank, from any thread).
  std::unique_ptr<Communicator> world(int rank);
  // Takes effect for collectives issued afterwards; each fault fires once.
  void inject(InProcessFault fault);

  // Runs body(world communicator) on one thread per rank and returns each rank's
  // error ("" when its body returned). An exception is the rank's error; it does not
  // stop the other ranks (a test makes the rank call abort_job for that).
  std::vector<std::string> run(const std::function<void(Communicator&)>& body);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace shardlm
