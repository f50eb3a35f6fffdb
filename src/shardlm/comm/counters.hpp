// Collective kinds, reduction operators and the per-kind counters a communicator
// keeps (calls, bytes, seconds, and the compute thread's exposed wait time).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string_view>

namespace shardlm {

enum class CollectiveKind : int {
  all_reduce = 0,
  reduce_scatter,
  all_gather,
  broadcast,
  barrier,
  // The exchanges of context and expert parallelism (Ulysses, MoE dispatch), and the
  // point-to-point steps of rings and pipelines (communicator.hpp).
  all_to_all,
  all_to_all_v,
  send,
  recv,
  send_recv,
  count
};
inline constexpr int kNumCollectiveKinds = static_cast<int>(CollectiveKind::count);
std::string_view to_string(CollectiveKind kind);

// Element-wise reduction. Every implementation combines the ranks' values in rank
// order, left to right: ((x_0 op x_1) op x_2) ... (see docs/communication.md).
enum class ReduceOp : int { sum = 0, max, min };
std::string_view to_string(ReduceOp op);

// How a reduce-scatter's values travel: as fp32, or rounded to bf16 (half the bytes).
// Either way every rank's contribution is reduced in fp32, in rank order.
enum class WireType : int { fp32 = 0, bf16 };
size_t wire_bytes(WireType wire);  // bytes per element on the wire

// Byte conventions (the ones nccl-tests uses, so figures compare with published ones):
// - bytes: "algorithm bytes", the size of the collective's full buffer as one rank sees
//   it: all_reduce count*4; reduce_scatter the send buffer (size * recv_count * 4);
//   all_gather the receive buffer (size * send_count * 4); broadcast its bytes;
//   barrier 0.
// - bus_bytes: what each rank must send at least under an optimal algorithm:
//   all_reduce 2(N-1)/N * bytes, reduce_scatter and all_gather (N-1)/N * bytes,
//   broadcast bytes; 0 when N == 1.
// - all_to_all: bytes = the send buffer (size * count_per_peer * element), bus_bytes
//   (N-1)/N * bytes (nccl-tests' alltoall); all_to_all_v: bytes = this rank's send
//   buffer, bus_bytes = what it sends to other ranks (its own block stays).
// - send: bytes = bus_bytes = the message; recv: bytes = the message, bus_bytes 0 (the
//   sender counts it); send_recv: bytes = bus_bytes = the message sent (0 bus bytes
//   when it goes to this rank itself).
// - messages: point-to-point messages this rank sends, counted for the kinds where
//   the operation fixes them: all_to_all(_v) one per other rank, send and send_recv
//   one (none to itself), recv none. 0 for the reductions, gathers and broadcasts,
//   whose message count is the algorithm's choice (plan's time model estimates it).
struct CollectiveStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  uint64_t bus_bytes = 0;
  uint64_t messages = 0;
  // Seconds the communication thread spent executing collectives of this kind (MPI
  // calls plus the reduction arithmetic), whether or not anyone waited on them.
  double seconds = 0.0;
};

uint64_t bus_bytes_for(CollectiveKind kind, uint64_t bytes, int world_size);

struct CommCounters {
  std::array<CollectiveStats, kNumCollectiveKinds> by_kind{};
  // Seconds the calling (compute) thread spent blocked in Work::wait(): the part of
  // the communication that was not hidden behind computation.
  double exposed_seconds = 0.0;

  CollectiveStats& operator[](CollectiveKind kind) { return by_kind[static_cast<int>(kind)]; }
  const CollectiveStats& operator[](CollectiveKind kind) const {
    return by_kind[static_cast<int>(kind)];
  }
  CollectiveStats total() const;
  CommCounters& operator+=(const CommCounters& other);
  // {"all_reduce": {"calls":..,"bytes":..,"bus_bytes":..,"messages":..,"seconds":..}, ...,
  //  "total": {...}, "exposed_seconds": ..}
  nlohmann::json to_json() const;
};

// The thread-safe accumulator behind Communicator::counters(): the compute thread
// adds calls and exposed time, the communication thread adds seconds.
class CounterBlock {
 public:
  void add_call(CollectiveKind kind, uint64_t bytes, uint64_t bus_bytes, uint64_t messages = 0);
  void add_seconds(CollectiveKind kind, double seconds);
  void add_exposed_seconds(double seconds);
  CommCounters snapshot() const;
  // Snapshot and reset (one call per training step). A collective still running is
  // charged to whichever step reads the counters after it finishes.
  CommCounters take();

 private:
  mutable std::mutex mutex_;
  CommCounters counters_;
};

}  // namespace shardlm
