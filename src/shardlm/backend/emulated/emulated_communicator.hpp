// Collectives on emulated device buffers (emulated_backend.hpp): the emulated
// device's stand-in for NCCL. Each collective untags its device pointers and is carried
// by a host communicator (MPI, in-process or single-process), with the same labels;
// host memory (the blocking helpers' values) passes through as it is.
#pragma once

#include <memory>

#include "shardlm/comm/communicator.hpp"

namespace shardlm::emulated {

class DeviceCommunicator final : public Communicator {
 public:
  // `host` carries the collectives and must outlive this; `owned`, if set, is `host`
  // itself, owned by this (a split's sub-communicator).
  explicit DeviceCommunicator(Communicator& host, std::unique_ptr<Communicator> owned = nullptr);
  ~DeviceCommunicator() override;

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

 private:
  Communicator& host_;
  std::unique_ptr<Communicator> owned_;
};

}  // namespace shardlm::emulated
