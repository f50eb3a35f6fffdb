// Communicator: the collectives the strategies need, asynchronous, counted, named.
//
// Every collective must be issued by every rank of the communicator in the same
// order (sequence numbers count them; see CommOptions::check_sequence). Each call
// carries a short label ("reduce_scatter unit h.3") that names it in timeout and
// error messages; labels must be the same on every rank. Buffers must stay valid
// and untouched until the returned Work has been waited for.
//
// Implementations: SingleProcessCommunicator (world size 1, no MPI) and
// MpiCommunicator; make_world_communicator() (world.hpp) picks one.
// InProcessCommunicator runs N ranks on N threads for unit tests.
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
  CommCounters counters() const { return counters_->snapshot(); }
  CommCounters take_counters() { return counters_->take(); }  // read and reset (per step)
  // Sequence number the next collective will get (the first is 0).
  uint64_t next_sequence() const;

 protected:
  Communicator(int rank, int size, std::string name, CommOptions options);

  // One collective as issued: what it is (for messages) and what every rank must
  // agree on (for the sequence check).
  struct Collective {
    CollectiveInfo info;
    uint64_t bytes = 0;  // algorithm bytes (counters.hpp)
    int root = -1;
    int op = -1;
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

  bool finalized() const;
  const std::shared_ptr<CounterBlock>& counter_block() const { return counters_; }
  // Names this process in messages: "rank R", R being the rank in the whole job.
  virtual std::string who() const;

 private:
  Collective begin(CollectiveKind kind, std::string label, uint64_t bytes, int root, int op);
  Work track(Work work);
  template <typename T>
  void all_reduce_values(std::span<T> values, ReduceOp op, std::string label);

  const int rank_;
  const int size_;
  const std::string name_;
  const CommOptions options_;
  const std::shared_ptr<CounterBlock> counters_ = std::make_shared<CounterBlock>();
  mutable std::mutex mutex_;
  uint64_t next_sequence_ = 0;
  bool finalized_ = false;
  std::vector<Work> unobserved_;  // pruned of observed ones as it grows
  size_t prune_at_ = 64;
};

}  // namespace shardlm
