// Collectives on emulated device buffers (backend/emulated/emulated_backend.hpp): the
// emulated device's stand-in for NCCL. Each operation untags its device pointers and
// is carried by a host communicator (MPI, in-process or single-process) under the same
// label, so it is validated, numbered, counted and given a deadline there as well;
// host memory (the blocking helpers' values) passes through as it is.
#pragma once

#include <memory>

#include "shardlm/comm/communicator.hpp"

namespace shardlm {

class EmulatedDeviceCommunicator final : public Communicator {
 public:
  // `host` carries the collectives and must outlive this; `owned`, if set, is `host`
  // itself, owned by this (a split's sub-communicator).
  explicit EmulatedDeviceCommunicator(Communicator& host,
                                      std::unique_ptr<Communicator> owned = nullptr);
  ~EmulatedDeviceCommunicator() override;

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  [[noreturn]] void abort_job(const std::string& message) override;
  void finalize() override;

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

 private:
  Communicator& host_;
  std::unique_ptr<Communicator> owned_;
};

}  // namespace shardlm
