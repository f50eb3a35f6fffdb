// MpiCommunicator: collectives over MPI (Open MPI from Debian, shared memory on one
// machine, TCP between machines). Every MPI call after start-up is made by the one
// communication thread (comm_thread.hpp) that all communicators of the process share,
// in the order the collectives were issued. Start-up and shutdown (MPI_Init_thread,
// MPI_Finalize) happen on the thread that creates and destroys the world.
#pragma once

#include <memory>
#include <string>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/comm/mpi_include.hpp"

namespace shardlm {

class MpiRuntime;

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI (or adopts an MPI the caller initialised with at least
  // MPI_THREAD_SERIALIZED; then finalize() leaves MPI_Finalize to the caller),
  // allocates the reduction scratch and starts the communication thread.
  static std::unique_ptr<MpiCommunicator> create_world(CommOptions options = {});
  ~MpiCommunicator() override;

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  [[noreturn]] void abort_job(const std::string& message) override;
  void finalize() override;

  // The MPI_THREAD_* level MPI provided.
  int thread_level() const;

  struct State;  // what queued collectives use: the MPI_Comm and the step check

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
  MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, std::shared_ptr<State> state, int rank,
                  int size, std::string name, CommOptions options, bool is_world);
  // Queues `body` behind the sequence check (and, for an all_to_all_v, the check of
  // every rank's `counts`).
  Work submit(const Collective& c, std::function<void(MPI_Comm)> body,
              const AllToAllCounts* counts = nullptr);

  std::shared_ptr<MpiRuntime> runtime_;
  std::shared_ptr<State> state_;
  bool is_world_;
};

}  // namespace shardlm
