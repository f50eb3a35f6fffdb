// Communicator: the collectives the strategies need, asynchronous, counted, named.
//
// Every collective must be issued by every rank of the communicator in the same
// order (sequence numbers count them; see CommOptions::check_sequence). Each call
// carries a short label ("reduce_scatter unit h.3") that names it in timeout and
// error messages; labels must be the same on every rank. Buffers must stay valid
// and untouched until the returned Work has been waited for.
//
// Point-to-point operations (send, recv, send_recv) involve two ranks and are matched
// per ordered pair: the k-th message this rank sends to rank q is the k-th message q
// receives from this rank (a send_recv's halves count as one send and one receive).
// Both sides must agree on label, count and dtype. They do not take collective
// sequence numbers, so they may be interleaved with collectives freely as long as
// each pair's order is the same on both sides. Each implementation runs a rank's
// operations in issue order and a lone send or recv completes only once its peer has
// posted the other side (like a blocking MPI_Send / MPI_Recv, or NCCL's ncclSend
// outside a group): a ring step must be one send_recv, since separate sends issued
// first on every rank can wait for each other for ever (the deadline then names them).
//
// Implementations: SingleProcessCommunicator (world size 1, no MPI) and
// MpiCommunicator; make_world_communicator() (world.hpp) picks one.
// InProcessCommunicator runs N ranks on N threads for unit tests. On device buffers:
// NcclCommunicator (nccl/) and the emulated device's EmulatedDeviceCommunicator;
// make_device_communicator() (device_communicator.hpp) picks one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "shardlm/comm/counters.hpp"
#include "shardlm/comm/work.hpp"
#include "shardlm/core/dtype.hpp"

namespace shardlm {

struct CommOptions {
  // Deadline of every wait, in seconds (--comm-timeout). On expiry the job is aborted
  // with a line naming the rank, the collective and the time waited.
  double timeout_seconds = 300.0;
  // Debug mode: before each collective the ranks exchange (sequence number, kind,
  // size, root, operator, label) and all fail with an error naming both sides if any
  // rank disagrees, instead of deadlocking or silently mixing up buffers. Costs one
  // small all-gather per collective.
  bool check_sequence = false;
  // MPI only. true: a queued collective starts as soon as the collectives before it
  // are done, overlapping whatever the caller computes meanwhile. false: it starts
  // only once the caller waits for it (or for a later one), so it never competes with
  // computation for cores and its time is all exposed. Measurements on this 2-vCPU
  // machine: docs/communication.md, "Overlap".
  bool overlap = true;
  // MPI only: reduction scratch, allocated once; it bounds the chunk a reduce-scatter
  // exchanges per step (scratch / (size - 1)).
  size_t scratch_bytes = size_t{4} << 20;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "world" or the name given to split(); appears in messages.
  const std::string& name() const { return name_; }
  const CommOptions& options() const { return options_; }

  // --- asynchronous collectives (float32 buffers) ---
  // In place: data[i] becomes the reduction of every rank's data[i].
  Work all_reduce(float* data, size_t count, ReduceOp op, std::string label);
  // `send` holds size() blocks of recv_count elements; this rank receives the
  // reduction of block rank(). recv may be send + rank() * recv_count (in place);
  // otherwise the buffers must not overlap. With WireType::bf16 every rank's values
  // (its own too, so the result does not depend on which rank owns a block) are
  // rounded to bf16 and travel at half the bytes; the reduction is fp32.
  Work reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op,
                      std::string label, WireType wire = WireType::fp32);
  // `recv` holds size() blocks of send_count elements; block r is rank r's `send`.
  // send may be recv + rank() * send_count (in place); otherwise no overlap.
  Work all_gather(const float* send, float* recv, size_t send_count, std::string label);
  // all_gather on raw bytes (same rules).
  Work all_gather_bytes(const void* send, void* recv, size_t bytes_per_rank, std::string label);
  // `root`'s bytes are copied to every rank's `data`.
  Work broadcast(void* data, size_t bytes, int root, std::string label);
  Work barrier(std::string label);

  // --- all-to-all (Ulysses sequence<->head exchange, expert dispatch and combine) ---
  // Counts are elements of the buffers' dtype (send's and recv's must be the same, and
  // the same on every rank). Blocks are packed in rank order: block p of `send` goes
  // to rank p, block p of `recv` comes from rank p; a rank's own block is copied. No
  // in-place: the buffers must not overlap.
  Work all_to_all(ConstTypedPtr send, TypedPtr recv, size_t count_per_peer, std::string label);
  // Variable splits: send_counts[p] elements to rank p and recv_counts[p] from rank p
  // (size() entries each; block offsets are their running sums). What rank p sends to
  // rank q must be what q expects from p: recv_counts[rank()] == send_counts[rank()]
  // is checked at the call, the other ranks' counts by the implementation, which fails
  // the collective naming both ranks. The count vectors are copied.
  Work all_to_all_v(ConstTypedPtr send, std::span<const size_t> send_counts, TypedPtr recv,
                    std::span<const size_t> recv_counts, std::string label);

  // --- point-to-point (ring attention, pipeline stages); matching rule above ---
  // `peer` is a rank of this communicator other than this rank.
  Work send(ConstTypedPtr data, size_t count, int peer, std::string label);
  Work recv(TypedPtr data, size_t count, int peer, std::string label);
  // Sends `send` to rank `to` while receiving into `recv` from rank `from`, both at
  // once (one ring step: to = rank + 1, from = rank - 1). to == from is allowed; if
  // either is this rank both must be (a ring of one: a copy). Buffers must not overlap.
  Work send_recv(ConstTypedPtr send, size_t send_count, int to, TypedPtr recv, size_t recv_count,
                 int from, std::string label);

  // --- small blocking helpers (loss sums, token counts, norms, config) ---
  // Queued behind earlier collectives like any other, then waited for.
  void all_reduce_blocking(std::span<double> values, ReduceOp op, std::string label);
  void all_reduce_blocking(std::span<int64_t> values, ReduceOp op, std::string label);
  // Every rank's `value`, indexed by rank (digests: "do all replicas agree?").
  std::vector<uint64_t> all_gather_u64(uint64_t value, std::string label);
  // Root's text replaces every rank's `text` (config JSON).
  void broadcast_string(std::string& text, int root, std::string label);

  // --- groups and failure ---
  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, rank). Hybrid sharding builds its shard groups and
  // replica groups with it. Destroy sub-communicators before their parent.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;
  // Prints "rank R: message" and ends the whole job with a non-zero exit (MPI_Abort),
  // so one rank's error brings every rank down instead of leaving them waiting.
  [[noreturn]] virtual void abort_job(const std::string& message) = 0;
  // Finishes queued collectives, then reports collectives whose Work was never waited
  // for (or seen done) as an error (a leak: the caller lost track of a buffer in
  // flight). For the world communicator also stops the communication thread and
  // finalizes MPI. Idempotent; destructors call it and print instead of throwing.
  virtual void finalize();

  // --- counters ---
  // This communicator's, and those of the groups split off it that count_with_parent()
  // folded in.
  CommCounters counters() const;
  CommCounters take_counters();  // read and reset (per step)
  // `child` (split off this communicator inside a component, as hybrid attention splits
  // its context group) counts its traffic into this one's counters too, so that whoever
  // reads this group's traffic (the trainer's per-step bytes) reads the child's as well.
  // The child's own counters() still read only its own; this one's take_counters() resets both.
  void count_with_parent(const Communicator& child);
  // Sequence number the next collective will get (the first is 0).
  uint64_t next_sequence() const;

 protected:
  Communicator(int rank, int size, std::string name, CommOptions options);

  // One collective as issued: what it is (for messages) and what every rank must
  // agree on (for the sequence check).
  struct Collective {
    CollectiveInfo info;
    uint64_t bytes = 0;  // algorithm bytes (counters.hpp)
    // What every rank's `bytes` must equal: `bytes`, except for all_to_all_v, whose
    // ranks send different amounts (0 there; the counts are checked instead).
    uint64_t agreed_bytes = 0;
    int root = -1;
    int op = -1;
    int dtype = -1;  // the DType of all_to_all(_v) and point-to-point buffers
  };
  // An all_to_all(_v)'s split, in elements per peer (all equal for all_to_all).
  struct AllToAllCounts {
    std::vector<size_t> send;
    std::vector<size_t> recv;
  };
  // One point-to-point operation: a send half (to >= 0), a receive half (from >= 0),
  // or both (send_recv). Counts in elements of the pointers' dtype.
  struct PointToPoint {
    ConstTypedPtr send;
    size_t send_count = 0;
    int to = -1;
    TypedPtr recv;
    size_t recv_count = 0;
    int from = -1;
  };
  // Implementations start the collective and return its Work; the base class has
  // already validated arguments, assigned the sequence number and counted the call.
  virtual Work start_all_reduce(float* data, size_t count, ReduceOp op, const Collective& c) = 0;
  virtual Work start_reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op,
                                    WireType wire, const Collective& c) = 0;
  virtual Work start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                                const Collective& c) = 0;
  virtual Work start_broadcast(void* data, size_t bytes, int root, const Collective& c) = 0;
  virtual Work start_barrier(const Collective& c) = 0;
  virtual Work start_all_to_all(ConstTypedPtr send, TypedPtr recv, const AllToAllCounts& counts,
                                const Collective& c) = 0;
  virtual Work start_point_to_point(const PointToPoint& p, const Collective& c) = 0;

  bool finalized() const;
  const std::shared_ptr<CounterBlock>& counter_block() const { return counters_; }
  // Names this process in messages: "rank R", R being the rank in the whole job.
  virtual std::string who() const;

 private:
  Collective begin(CollectiveKind kind, std::string label, uint64_t bytes, int root, int op);
  // Checks the communicator is not finalized, numbers a collective (point-to-point
  // operations are numbered per pair by the caller) and counts the call.
  Collective begin_counted(CollectiveKind kind, std::string label, uint64_t bytes,
                           uint64_t bus_bytes, uint64_t messages);
  Work begin_all_to_all(CollectiveKind kind, ConstTypedPtr send, TypedPtr recv,
                        AllToAllCounts counts, std::string label);
  Work begin_point_to_point(CollectiveKind kind, const PointToPoint& p, std::string label);
  Work track(Work work);
  template <typename T>
  void all_reduce_values(std::span<T> values, ReduceOp op, std::string label);

  const int rank_;
  const int size_;
  const std::string name_;
  const CommOptions options_;
  const std::shared_ptr<CounterBlock> counters_ = std::make_shared<CounterBlock>();
  std::vector<std::shared_ptr<CounterBlock>> children_counters_;  // count_with_parent(); under mutex_
  mutable std::mutex mutex_;
  uint64_t next_sequence_ = 0;
  std::vector<uint64_t> sends_to_;        // per peer: point-to-point messages sent to it
  std::vector<uint64_t> receives_from_;   // per peer: messages received from it
  bool finalized_ = false;
  std::vector<Work> unobserved_;  // pruned of observed ones as it grows
  size_t prune_at_ = 64;
};

}  // namespace shardlm
