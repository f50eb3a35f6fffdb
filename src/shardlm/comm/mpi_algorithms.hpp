// The MPI algorithms behind MpiCommunicator, as plain functions on an MPI_Comm so the
// benchmark can time them against the library's own collectives. Called from one
// thread at a time (the communication thread); they throw shardlm::Error when an MPI
// call fails (the communicator sets MPI_ERRORS_RETURN).
//
// Reductions follow reduce_kernels.hpp (rank order), so results do not depend on
// message size, chunking or how a buffer is split into collectives. Choices and
// measurements: docs/communication.md.
#pragma once

#include <cstddef>

#include "shardlm/comm/counters.hpp"
#include "shardlm/comm/mpi_include.hpp"

namespace shardlm::mpi {

// Throws "<call> failed: <MPI error string>" unless rc == MPI_SUCCESS.
void check(int rc, const char* call);

// Reduction scratch owned by the caller and allocated once; it bounds the chunk a
// reduce-scatter exchanges per round to floats / (size - 1) elements.
struct Scratch {
  float* data = nullptr;
  size_t floats = 0;
};

// Gathered bytes (count * size * 4) at or below which an all-reduce is one all-gather
// plus a local reduction instead of reduce-scatter + all-gather (fewer round trips).
inline constexpr size_t kSmallAllReduceBytes = size_t{64} << 10;

// Reduce-scatter by direct exchange: for each chunk, every rank sends block p's chunk
// to rank p and receives its own block's chunk from every peer (point-to-point,
// (N-1)/N of the buffer each way, like a ring), then reduces the N chunks in rank
// order. recv may be send + rank * recv_count. WireType::bf16 rounds every outgoing
// chunk (and this rank's own) to bf16 in the scratch and sends half the bytes.
void reduce_scatter_rank_order(MPI_Comm comm, const float* send, float* recv, size_t recv_count,
                               ReduceOp op, Scratch scratch, WireType wire = WireType::fp32);

// All-reduce in place, bitwise equal to reduce_scatter_rank_order + all_gather on the
// same elements: the first size*floor(count/size) elements go through exactly that,
// the last count % size (and whole buffers up to kSmallAllReduceBytes gathered) are
// all-gathered into the scratch and reduced locally in rank order.
void all_reduce_rank_order(MPI_Comm comm, float* data, size_t count, ReduceOp op, Scratch scratch,
                           size_t small_all_reduce_bytes = kSmallAllReduceBytes);

// All-gather of bytes_per_rank bytes per rank; send may be recv + rank * bytes_per_rank.
// The library's MPI_Allgather, or the direct exchange when a block exceeds INT_MAX.
void all_gather(MPI_Comm comm, const void* send, void* recv, size_t bytes_per_rank);
// The direct-exchange all-gather (point-to-point, chunk_bytes per message).
void all_gather_direct(MPI_Comm comm, const void* send, void* recv, size_t bytes_per_rank,
                       size_t chunk_bytes = size_t{64} << 20);

// MPI_Bcast in pieces of at most 1 GiB (MPI counts are int).
void broadcast(MPI_Comm comm, void* data, size_t bytes, int root);

// All-to-all by direct exchange: block p of `send` (send_bytes[p], blocks packed in
// rank order) goes to rank p, block p of `recv` (recv_bytes[p]) comes from rank p; the
// own block is copied. Every peer gets at least one message (an empty one for an empty
// block) and messages are at most chunk_bytes, so a peer that sends less than this
// rank expects is an error naming it ("rank 2 sent 12 bytes where 16 were expected")
// instead of a message left for a later call. One that sends more is caught only by
// the sequence check (or the deadline): Open MPI's truncated receive did not return
// in our test.
// Receives are posted first, then sends to the nearest ranks upwards (as in
// reduce_scatter_rank_order).
void all_to_all_v(MPI_Comm comm, const void* send, const size_t* send_bytes, void* recv,
                  const size_t* recv_bytes, size_t chunk_bytes = size_t{1} << 30);
// MPI_Alltoall on equal blocks (the library's algorithm, for the benchmark).
void all_to_all_library(MPI_Comm comm, const void* send, void* recv, size_t bytes_per_peer);

// Point-to-point: sends `send_bytes` to rank `to` (none when to < 0) while receiving
// `recv_bytes` from rank `from` (none when from < 0), both posted before either is
// waited for; to == from == this rank is a copy. Messages are chunked and checked as
// in all_to_all_v. Returns once both are done: a lone send waits for its receiver's
// matching receive only as long as MPI does (eager messages complete at once).
void send_recv(MPI_Comm comm, const void* send, size_t send_bytes, int to, void* recv,
               size_t recv_bytes, int from, size_t chunk_bytes = size_t{1} << 30);

}  // namespace shardlm::mpi
