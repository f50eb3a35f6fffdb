// SingleProcessCommunicator: world size 1. Every collective is an identity (a copy
// when the output is a different buffer), done at once on the calling thread; no MPI
// call is made, so plain `shardlm train` runs without an MPI launcher.
#pragma once

#include "shardlm/comm/communicator.hpp"

namespace shardlm {

class SingleProcessCommunicator final : public Communicator {
 public:
  explicit SingleProcessCommunicator(CommOptions options = {}, std::string name = "world");
  ~SingleProcessCommunicator() override;

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  // Prints "rank 0: message" and exits the process with status 1.
  [[noreturn]] void abort_job(const std::string& message) override;

 protected:
  Work start_all_reduce(float* data, size_t count, ReduceOp op, const Collective& c) override;
  Work start_reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op,
                            WireType wire, const Collective& c) override;
  Work start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                        const Collective& c) override;
  Work start_broadcast(void* data, size_t bytes, int root, const Collective& c) override;
  Work start_barrier(const Collective& c) override;
  // Size 1: the own block is the whole exchange; a point-to-point operation can only
  // be a send_recv to itself (a ring of one).
  Work start_all_to_all(ConstTypedPtr send, TypedPtr recv, const AllToAllCounts& counts,
                        const Collective& c) override;
  Work start_point_to_point(const PointToPoint& p, const Collective& c) override;

 private:
  // Copies `bytes` unless source and destination are the same, and returns a Work
  // that is already done (seconds counted).
  Work finish_copy(const void* from, void* to, size_t bytes, const Collective& c);
  std::shared_ptr<const WaitPolicy> policy_;
};

}  // namespace shardlm
