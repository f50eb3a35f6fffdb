#include "shardlm/comm/mpi_algorithms.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <vector>

#include "shardlm/core/dtype.hpp"
#include "shardlm/comm/reduce_kernels.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm::mpi {

namespace {

// One tag per algorithm: the communication thread runs one collective at a time and
// MPI keeps messages between two ranks in order, so fixed tags cannot mix up rounds.
constexpr int kReduceScatterTag = 7101;
constexpr int kAllGatherTag = 7102;
constexpr int kAllToAllTag = 7103;
constexpr int kPointToPointTag = 7104;

struct CommShape {
  int size = 1;
  int rank = 0;
};

CommShape shape_of(MPI_Comm comm) {
  CommShape s;
  check(MPI_Comm_size(comm, &s.size), "MPI_Comm_size");
  check(MPI_Comm_rank(comm, &s.rank), "MPI_Comm_rank");
  return s;
}

}  // namespace

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, length)));
}

namespace {

// One chunked exchange serves both wires. Per chunk, every rank sends block p's chunk
// to rank p and receives its own block's chunk from every peer, then reduces the N
// chunks in rank order. Receives are posted first, from the nearest peers downwards;
// sends go to the nearest upwards, so every round pairs each sender with a posted
// receive.
//  - fp32 (Wire = float): peers' chunks arrive in the scratch; the send buffer and
//    this rank's own block are read where they are.
//  - bf16 (Wire = uint16_t): the outgoing chunks and this rank's own are rounded into
//    the scratch too (2n - 1 bf16 chunks in the scratch's bytes), and the reduction
//    widens them to fp32.
template <typename Wire>
void exchange_and_reduce(MPI_Comm comm, int n, int r, const float* send, float* recv,
                         size_t recv_count, ReduceOp op, Scratch scratch) {
  constexpr bool kBf16 = std::is_same_v<Wire, uint16_t>;
  const MPI_Datatype type = kBf16 ? MPI_UINT16_T : MPI_FLOAT;
  const size_t slots = kBf16 ? 2 * scratch.floats / (2 * static_cast<size_t>(n) - 1)
                             : scratch.floats / (n - 1);
  const size_t chunk = std::min({recv_count, slots, size_t{INT_MAX}});
  SHARDLM_CHECK(chunk >= 1, "reduce-scatter scratch of {} floats is too small for {} ranks",
                scratch.floats, n);
  Wire* received = reinterpret_cast<Wire*>(scratch.data);
  Wire* outgoing = received + static_cast<size_t>(n - 1) * chunk;  // bf16 only
  Wire* own = outgoing + static_cast<size_t>(n - 1) * chunk;       // bf16 only
  const auto round = [](Wire* dst, const float* src, size_t count) {
    for (size_t i = 0; i < count; ++i) dst[i] = float_to_bf16(src[i]);
  };
  std::vector<MPI_Request> requests(2 * (n - 1));
  std::vector<const Wire*> inputs(n);
  for (size_t offset = 0; offset < recv_count; offset += chunk) {
    const size_t c = std::min(chunk, recv_count - offset);
    const int count = static_cast<int>(c);
    int k = 0;
    for (int step = 1; step < n; ++step) {
      const int from = (r - step + n) % n;
      Wire* slot = received + static_cast<size_t>(step - 1) * chunk;
      inputs[from] = slot;
      check(MPI_Irecv(slot, count, type, from, kReduceScatterTag, comm, &requests[k++]),
            "MPI_Irecv");
    }
    for (int step = 1; step < n; ++step) {
      const int to = (r + step) % n;
      const float* block = send + static_cast<size_t>(to) * recv_count + offset;
      const Wire* message = nullptr;
      if constexpr (kBf16) {
        Wire* slot = outgoing + static_cast<size_t>(step - 1) * chunk;
        round(slot, block, c);
        message = slot;
      } else {
        message = block;
      }
      check(MPI_Isend(message, count, type, to, kReduceScatterTag, comm, &requests[k++]),
            "MPI_Isend");
    }
    const float* own_block = send + static_cast<size_t>(r) * recv_count + offset;
    if constexpr (kBf16) {
      round(own, own_block, c);
      inputs[r] = own;
    } else {
      inputs[r] = own_block;
    }
    check(MPI_Waitall(k, requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    reduce_in_rank_order(inputs.data(), n, recv + offset, c, op);
  }
}

}  // namespace

void reduce_scatter_rank_order(MPI_Comm comm, const float* send, float* recv, size_t recv_count,
                               ReduceOp op, Scratch scratch, WireType wire) {
  const auto [n, r] = shape_of(comm);
  const float* own = send + static_cast<size_t>(r) * recv_count;
  if (recv_count == 0) return;
  if (n == 1) {
    if (wire == WireType::bf16) {  // the one contribution, as it would travel
      for (size_t i = 0; i < recv_count; ++i) recv[i] = round_to(DType::bf16, own[i]);
    } else if (recv != own) {
      std::memcpy(recv, own, recv_count * sizeof(float));
    }
    return;
  }
  if (wire == WireType::bf16) {
    exchange_and_reduce<uint16_t>(comm, n, r, send, recv, recv_count, op, scratch);
  } else {
    exchange_and_reduce<float>(comm, n, r, send, recv, recv_count, op, scratch);
  }
}

// All-gather `count` floats from every rank into the scratch and reduce them in rank
// order into data.
static void all_reduce_by_gathering(MPI_Comm comm, int n, float* data, size_t count, ReduceOp op,
                                    Scratch scratch) {
  SHARDLM_ASSERT(count * n <= scratch.floats && count <= size_t{INT_MAX});
  const int c = static_cast<int>(count);
  check(MPI_Allgather(data, c, MPI_FLOAT, scratch.data, c, MPI_FLOAT, comm), "MPI_Allgather");
  reduce_gathered(scratch.data, n, count, data, op);
}

void all_reduce_rank_order(MPI_Comm comm, float* data, size_t count, ReduceOp op, Scratch scratch,
                           size_t small_all_reduce_bytes) {
  const auto [n, r] = shape_of(comm);
  if (n == 1 || count == 0) return;
  const size_t gathered = count * n;
  if (gathered * sizeof(float) <= small_all_reduce_bytes && gathered <= scratch.floats) {
    all_reduce_by_gathering(comm, n, data, count, op, scratch);
    return;
  }
  const size_t block = count / n;
  const size_t leftover = count % n;
  if (block > 0) {
    float* own = data + static_cast<size_t>(r) * block;
    reduce_scatter_rank_order(comm, data, own, block, op, scratch);
    all_gather(comm, own, data, block * sizeof(float));
  }
  if (leftover > 0) {
    SHARDLM_CHECK(leftover * n <= scratch.floats,
                  "all-reduce scratch of {} floats is too small for {} ranks", scratch.floats, n);
    all_reduce_by_gathering(comm, n, data + block * n, leftover, op, scratch);
  }
}

void all_gather(MPI_Comm comm, const void* send, void* recv, size_t bytes_per_rank) {
  const auto [n, r] = shape_of(comm);
  char* own = static_cast<char*>(recv) + static_cast<size_t>(r) * bytes_per_rank;
  if (n == 1) {
    if (send != own && bytes_per_rank > 0) std::memcpy(own, send, bytes_per_rank);
    return;
  }
  if (bytes_per_rank == 0) return;
  if (bytes_per_rank > size_t{INT_MAX}) {
    all_gather_direct(comm, send, recv, bytes_per_rank);
    return;
  }
  const int b = static_cast<int>(bytes_per_rank);
  check(MPI_Allgather(send == own ? MPI_IN_PLACE : send, b, MPI_BYTE, recv, b, MPI_BYTE, comm),
        "MPI_Allgather");
}

void all_gather_direct(MPI_Comm comm, const void* send, void* recv, size_t bytes_per_rank,
                       size_t chunk_bytes) {
  const auto [n, r] = shape_of(comm);
  char* base = static_cast<char*>(recv);
  char* own = base + static_cast<size_t>(r) * bytes_per_rank;
  if (send != own && bytes_per_rank > 0) std::memcpy(own, send, bytes_per_rank);
  if (n == 1 || bytes_per_rank == 0) return;
  const size_t chunk = std::clamp<size_t>(chunk_bytes, 1, size_t{INT_MAX});
  std::vector<MPI_Request> requests(2 * (n - 1));
  for (size_t offset = 0; offset < bytes_per_rank; offset += chunk) {
    const int count = static_cast<int>(std::min(chunk, bytes_per_rank - offset));
    int k = 0;
    for (int step = 1; step < n; ++step) {
      const int from = (r - step + n) % n;
      check(MPI_Irecv(base + static_cast<size_t>(from) * bytes_per_rank + offset, count, MPI_BYTE,
                      from, kAllGatherTag, comm, &requests[k++]),
            "MPI_Irecv");
    }
    for (int step = 1; step < n; ++step) {
      const int to = (r + step) % n;
      check(MPI_Isend(own + offset, count, MPI_BYTE, to, kAllGatherTag, comm, &requests[k++]),
            "MPI_Isend");
    }
    check(MPI_Waitall(k, requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
}

void broadcast(MPI_Comm comm, void* data, size_t bytes, int root) {
  constexpr size_t kPiece = size_t{1} << 30;
  for (size_t offset = 0; offset < bytes; offset += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, bytes - offset));
    check(MPI_Bcast(static_cast<char*>(data) + offset, count, MPI_BYTE, root, comm), "MPI_Bcast");
  }
}

namespace {

// The messages of one direct exchange: receives posted first, then sends, all waited
// for together; then every receive's size is checked against what was expected.
class Exchange {
 public:
  Exchange(MPI_Comm comm, int tag, size_t chunk_bytes)
      : comm_(comm), tag_(tag), chunk_(std::clamp<size_t>(chunk_bytes, 1, size_t{INT_MAX})) {}

  // At least one message, so an empty block still pairs with its peer's.
  void receive(void* data, size_t bytes, int from) {
    size_t offset = 0;
    do {
      const int count = static_cast<int>(std::min(chunk_, bytes - offset));
      requests_.emplace_back();
      expected_.push_back({from, count});
      check(MPI_Irecv(static_cast<char*>(data) + offset, count, MPI_BYTE, from, tag_, comm_,
                      &requests_.back()),
            "MPI_Irecv");
      offset += static_cast<size_t>(count);
    } while (offset < bytes);
  }
  void send(const void* data, size_t bytes, int to) {
    size_t offset = 0;
    do {
      const int count = static_cast<int>(std::min(chunk_, bytes - offset));
      requests_.emplace_back();
      expected_.push_back({-1, count});
      check(MPI_Isend(static_cast<const char*>(data) + offset, count, MPI_BYTE, to, tag_, comm_,
                      &requests_.back()),
            "MPI_Isend");
      offset += static_cast<size_t>(count);
    } while (offset < bytes);
  }
  void wait() {
    if (requests_.empty()) return;
    std::vector<MPI_Status> statuses(requests_.size());
    const int rc = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (size_t i = 0; i < statuses.size(); ++i)
        if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
          const int from = expected_[i].from;
          try {
            check(statuses[i].MPI_ERROR, from >= 0 ? "MPI_Irecv" : "MPI_Isend");
          } catch (const Error& e) {
            if (from < 0) throw;
            throw Error(fmt::format("{} (rank {} sent more than the {} bytes expected?)", e.what(),
                                    from, expected_[i].bytes));
          }
        }
    }
    check(rc, "MPI_Waitall");
    for (size_t i = 0; i < statuses.size(); ++i) {
      if (expected_[i].from < 0) continue;
      int received = 0;
      check(MPI_Get_count(&statuses[i], MPI_BYTE, &received), "MPI_Get_count");
      SHARDLM_CHECK(received == expected_[i].bytes,
                    "rank {} sent {} bytes where {} were expected (the two sides' counts disagree)",
                    expected_[i].from, received, expected_[i].bytes);
    }
  }

 private:
  struct Expected {
    int from;  // -1 for a send
    int bytes;
  };
  MPI_Comm comm_;
  int tag_;
  size_t chunk_;
  std::vector<MPI_Request> requests_;
  std::vector<Expected> expected_;
};

}  // namespace

void all_to_all_v(MPI_Comm comm, const void* send, const size_t* send_bytes, void* recv,
                  const size_t* recv_bytes, size_t chunk_bytes) {
  const auto [n, r] = shape_of(comm);
  std::vector<size_t> send_offset(static_cast<size_t>(n) + 1, 0), recv_offset(send_offset);
  for (int p = 0; p < n; ++p) {
    send_offset[p + 1] = send_offset[p] + send_bytes[p];
    recv_offset[p + 1] = recv_offset[p] + recv_bytes[p];
  }
  const auto* from_base = static_cast<const char*>(send);
  auto* to_base = static_cast<char*>(recv);
  Exchange exchange(comm, kAllToAllTag, chunk_bytes);
  for (int step = 1; step < n; ++step) {
    const int from = (r - step + n) % n;
    exchange.receive(to_base + recv_offset[from], recv_bytes[from], from);
  }
  for (int step = 1; step < n; ++step) {
    const int to = (r + step) % n;
    exchange.send(from_base + send_offset[to], send_bytes[to], to);
  }
  SHARDLM_CHECK(send_bytes[r] == recv_bytes[r],
                "all-to-all: this rank sends {} bytes to itself but expects {}", send_bytes[r],
                recv_bytes[r]);
  if (send_bytes[r] > 0) std::memcpy(to_base + recv_offset[r], from_base + send_offset[r], send_bytes[r]);
  exchange.wait();
}

void all_to_all_library(MPI_Comm comm, const void* send, void* recv, size_t bytes_per_peer) {
  SHARDLM_CHECK(bytes_per_peer <= size_t{INT_MAX}, "MPI_Alltoall: {} bytes per peer exceed INT_MAX",
                bytes_per_peer);
  const int b = static_cast<int>(bytes_per_peer);
  check(MPI_Alltoall(send, b, MPI_BYTE, recv, b, MPI_BYTE, comm), "MPI_Alltoall");
}

void send_recv(MPI_Comm comm, const void* send, size_t send_bytes, int to, void* recv,
               size_t recv_bytes, int from, size_t chunk_bytes) {
  const auto [n, r] = shape_of(comm);
  (void)n;
  if (to == r || from == r) {
    SHARDLM_CHECK(to == r && from == r && send_bytes == recv_bytes,
                  "send_recv to itself: to {} from {}, {} bytes sent, {} expected", to, from,
                  send_bytes, recv_bytes);
    if (send_bytes > 0 && send != recv) std::memcpy(recv, send, send_bytes);
    return;
  }
  Exchange exchange(comm, kPointToPointTag, chunk_bytes);
  if (from >= 0) exchange.receive(recv, recv_bytes, from);
  if (to >= 0) exchange.send(send, send_bytes, to);
  exchange.wait();
}

}  // namespace shardlm::mpi
