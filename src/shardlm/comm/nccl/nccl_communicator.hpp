// NcclCommunicator: the Communicator interface over NCCL, on device buffers, one
// rank per GPU (compiled only with CUDA: SHARDLM_WITH_CUDA).
//
// Completion, ordering and deadlines:
// - Every collective is enqueued on one communication stream per process (created
//   cudaStreamNonBlocking, shared by the world and its splits so that collectives run
//   in issue order, as the CPU communicators' one communication thread does). Before
//   the collective, that stream waits on an event recorded on the compute stream
//   (NcclOptions::compute_stream / set_compute_stream()), so it reads what the compute
//   stream wrote before the call. The host never blocks inside a collective call.
// - Completion is an event recorded on the communication stream after the collective
//   (a CompletionSource, work.hpp). Work::wait() blocks the host until it fires;
//   Work::wait_on_stream(s) makes stream s wait for it without blocking the host.
// - Deadlines: a DeviceWatchdog thread (one per process) polls every collective in
//   flight; one that passes CommOptions::timeout_seconds is reported as
//   "rank R: all_gather 'unit h.3' (#41 on world) did not finish within 300 s", its
//   NCCL communicator is aborted (ncclCommAbort) and the job is ended (MPI_Abort),
//   so no rank hangs waiting for a peer that never joins.
//
// Host memory: collectives on host buffers (the base class's blocking helpers such as
// all_reduce_blocking, all_gather_u64, broadcast_string, or any host pointer) go
// through the host communicator this one was built on (MPI, or the single-process one
// at world size 1), as PyTorch routes CPU tensors to gloo next to NCCL. Their seconds
// are counted by host().counters(); calls and bytes here as well.
//
// Reductions: NCCL's sums (ring or tree) add in an order that depends on topology and
// size, so the default path agrees with the CPU communicators' rank-order sum within
// fp32 rounding, not bitwise. NcclOptions::ordered (or SHARDLM_NCCL_ORDERED=1) makes
// every reduction rank-ordered and bitwise equal to the CPU path: reduce_scatter is an
// all-to-all of the blocks (grouped ncclSend/ncclRecv) into a scratch plus a local
// left-to-right fp32 sum kernel (as Megatron does for reproducibility); all_reduce is
// an all-gather of the whole buffer plus the same kernel (N times the traffic).
// reduce_scatter with WireType::bf16 always takes the ordered path: bf16 travels,
// the reduction stays fp32 (an NCCL bf16 reduction would round at every step).
//
// All-to-all and point-to-point: ncclSend/ncclRecv, grouped (ncclGroupStart/End) so
// that every peer's transfer of an all_to_all(_v), and both halves of a send_recv, are
// in flight together. A lone send or recv occupies the communication stream until its
// peer posts the other side (NCCL's rule), so later collectives of this process wait
// behind it; a ring must use send_recv. NCCL matches messages per pair in order, like
// the CPU communicators; it cannot see counts that disagree (a receive larger than
// the message never completes, and the deadline names it).
//
// Not covered: CommOptions::check_sequence and overlap apply to the host collectives
// only. Start-up (ncclCommInitRank) and split (ncclCommSplit) block the host without
// a deadline; a rank that fails before reaching them aborts the job over MPI.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "shardlm/comm/communicator.hpp"

namespace shardlm {

struct NcclOptions {
  // cudaStream_t the caller computes on; collectives are ordered after the work
  // enqueued on it before the call. nullptr: the legacy default stream.
  void* compute_stream = nullptr;
  // Rank-ordered, bitwise reproducible reductions (see above). Also turned on by the
  // environment variable SHARDLM_NCCL_ORDERED=1.
  bool ordered = false;
  // GPU to use; -1: the rank's index among the ranks on its host (local rank).
  int device = -1;
  // How often the watchdog polls collectives in flight.
  double watchdog_poll_seconds = 0.01;
  // Called with the timeout line after the NCCL communicator was aborted. Default
  // (empty): print the line and end the job (MPI_Abort). Tests record it instead;
  // the waiter then gets CommTimeout.
  std::function<void(const std::string& line)> on_timeout;
};

class NcclRuntime;
struct NcclCommHandle;

class NcclCommunicator final : public Communicator {
 public:
  // Builds the NCCL world over `host` (its rank and size; collective over it): selects
  // the GPU, rank 0 makes the NCCL unique id and broadcasts it over `host`, every rank
  // joins with ncclCommInitRank. Takes ownership of `host` (finalized with this one).
  static std::unique_ptr<NcclCommunicator> create(std::unique_ptr<Communicator> host,
                                                  CommOptions options = {},
                                                  NcclOptions nccl = {});
  // create() over make_world_communicator(options): MPI under mpirun, else size 1.
  static std::unique_ptr<NcclCommunicator> create_world(CommOptions options = {},
                                                        NcclOptions nccl = {});
  ~NcclCommunicator() override;

  // ncclCommSplit plus the host communicator's split, same color and key.
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  [[noreturn]] void abort_job(const std::string& message) override;
  // Waits (within the deadline) for collectives in flight, then reports leaks, frees
  // the NCCL communicator and finalizes the host communicator.
  void finalize() override;

  // The compute stream of this process (shared with splits); see NcclOptions.
  void set_compute_stream(void* stream);
  void* compute_stream() const;
  void* communication_stream() const;
  int device() const;
  bool ordered() const { return ordered_; }
  Communicator& host() { return *host_; }
  // ncclCommAbort now: collectives in flight and later ones fail instead of hanging.
  // What the watchdog does on a deadline; public for shutdown after an error.
  void abort_nccl();

 protected:
  Work start_all_reduce(float* data, size_t count, ReduceOp op, const Collective& c) override;
  Work start_reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op,
                            WireType wire, const Collective& c) override;
  Work start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                        const Collective& c) override;
  Work start_broadcast(void* data, size_t bytes, int root, const Collective& c) override;
  Work start_barrier(const Collective& c) override;
  // Grouped ncclSend/ncclRecv per peer (the own block, and a send_recv to itself, by
  // cudaMemcpyAsync on the communication stream).
  Work start_all_to_all(ConstTypedPtr send, TypedPtr recv, const AllToAllCounts& counts,
                        const Collective& c) override;
  Work start_point_to_point(const PointToPoint& p, const Collective& c) override;
  std::string who() const override;

 private:
  NcclCommunicator(std::shared_ptr<NcclRuntime> runtime, std::shared_ptr<NcclCommHandle> comm,
                   std::unique_ptr<Communicator> host, int rank, int size, std::string name,
                   CommOptions options, bool ordered);
  // Enqueues `body` on the communication stream behind the compute stream's work and
  // returns a Work completed by an event after it. `body` gets the ncclComm_t and the
  // cudaStream_t (as void*).
  Work issue(const Collective& c, const std::function<void(void* comm, void* stream)>& body);
  // true when every non-null pointer is device (or managed) memory, false when every
  // one is host memory; a mix is an error naming the collective.
  bool on_device(const Collective& c, std::initializer_list<const void*> pointers) const;

  std::shared_ptr<NcclRuntime> runtime_;
  std::shared_ptr<NcclCommHandle> comm_;
  std::unique_ptr<Communicator> host_;
  const bool ordered_;
  float* barrier_word_ = nullptr;  // device float the barrier all-reduces
};

}  // namespace shardlm
