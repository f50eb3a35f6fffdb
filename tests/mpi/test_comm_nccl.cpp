// NcclCommunicator under mpirun: `mpirun -n N mpi_test_comm_nccl` (CTest runs N=1 and
// N=2), or started alone: N=1 without MPI (CTest's comm_nccl_alone; scripts/gpu_check.sh
// runs it so, where Open MPI's runtime files are not installed). Needs one GPU per rank;
// where the build has no CUDA, or this host has fewer GPUs than ranks, every case is
// instantiated and reported SKIPPED with the reason (and the job prints "NCCL tests
// skipped: <reason>", which CTest reports as skipped).
//
// Expectations come from formulas (integer-valued floats: every summation order gives
// the same bits) or, for the ordered and bf16 paths, from a scalar left-to-right fp32
// sum on the host of every rank's inputs (regenerated from the rank number): bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shardlm/comm/world.hpp"
#include "shardlm/core/dtype.hpp"

#ifdef SHARDLM_WITH_CUDA
#include <cuda_runtime.h>

#include "shardlm/comm/nccl/nccl_communicator.hpp"
#endif

namespace shardlm {
namespace {

std::string skip_reason;  // empty: the NCCL cases run
Communicator* host_world = nullptr;

#define SKIP_WITHOUT_NCCL() \
  if (!skip_reason.empty()) GTEST_SKIP() << skip_reason

#ifdef SHARDLM_WITH_CUDA
// Small integers: exact in any summation order.
float exact_value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}
// Arbitrary floats (a hash of rank and index): their sum depends on the order.
float noisy_value(int rank, size_t i) {
  uint64_t h = (static_cast<uint64_t>(rank) << 40) ^ (i * 0x9e3779b97f4a7c15ull);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  return (static_cast<float>(h >> 40) / 16777216.0f - 0.5f) * 7.3f;
}

NcclCommunicator* world = nullptr;          // default (NCCL's own reductions)
NcclCommunicator* ordered_world = nullptr;  // NcclOptions::ordered

void check_cuda(cudaError_t error, const char* what) {
  ASSERT_EQ(error, cudaSuccess) << what << ": " << cudaGetErrorString(error);
}

// A device buffer of floats (or bytes, via float count), filled and read with
// synchronous copies on the legacy default stream, the tests' compute stream.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t count) : count_(count) {
    if (count_ > 0) check_cuda(cudaMalloc(reinterpret_cast<void**>(&data_), count_ * sizeof(float)), "cudaMalloc");
  }
  explicit DeviceFloats(const std::vector<float>& values) : DeviceFloats(values.size()) {
    upload(values);
  }
  ~DeviceFloats() { (void)cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void upload(const std::vector<float>& values) {
    if (!values.empty())
      check_cuda(cudaMemcpy(data_, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<float> download() const {
    std::vector<float> out(count_);
    if (count_ > 0)
      check_cuda(cudaMemcpy(out.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  float* get() const { return data_; }

 private:
  size_t count_;
  float* data_ = nullptr;
};

// Bounded stream synchronisation: a test that would hang fails instead.
void sync_within(cudaStream_t stream, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return;
    ASSERT_EQ(state, cudaErrorNotReady) << cudaGetErrorString(state);
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "stream did not finish";
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

std::vector<size_t> counts(int n) { return {1, static_cast<size_t>(n) * 5 + 1, 4096, 100003}; }
#endif

TEST(NcclCollectives, AllReduceSumMaxMinAreExactOnBothPaths) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  for (NcclCommunicator* comm : {world, ordered_world}) {
    const int n = comm->size();
    const int r = comm->rank();
    for (size_t count : counts(n)) {
      std::vector<float> input(count);
      for (size_t i = 0; i < count; ++i) input[i] = exact_value(r, i);
      DeviceFloats sum(input), max(input), min(input);
      Work a = comm->all_reduce(sum.get(), count, ReduceOp::sum, "sum");
      Work b = comm->all_reduce(max.get(), count, ReduceOp::max, "max");
      Work c = comm->all_reduce(min.get(), count, ReduceOp::min, "min");
      a.wait();
      b.wait();
      c.wait();
      const auto s = sum.download(), mx = max.download(), mn = min.download();
      for (size_t i = 0; i < count; ++i) {
        const float base = static_cast<float>(i % 13 + 1);
        ASSERT_EQ(s[i], base * n * (n + 1) / 2) << "ordered " << comm->ordered() << " count " << count;
        ASSERT_EQ(mx[i], base * n) << "count " << count << " i " << i;
        ASSERT_EQ(mn[i], base) << "count " << count << " i " << i;
      }
    }
  }
#endif
}

TEST(NcclCollectives, OrderedAllReduceIsTheRankOrderSumBitwise) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  const int n = ordered_world->size();
  const size_t count = 10007;
  std::vector<float> input(count), expected(count);
  for (size_t i = 0; i < count; ++i) {
    input[i] = noisy_value(ordered_world->rank(), i);
    float acc = noisy_value(0, i);
    for (int q = 1; q < n; ++q) acc += noisy_value(q, i);
    expected[i] = acc;
  }
  DeviceFloats data(input);
  ordered_world->all_reduce(data.get(), count, ReduceOp::sum, "ordered sum").wait();
  const auto got = data.download();
  ASSERT_EQ(std::memcmp(got.data(), expected.data(), count * sizeof(float)), 0);
#endif
}

TEST(NcclCollectives, ReduceScatterIsExactSeparateAndInPlace) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  for (NcclCommunicator* comm : {world, ordered_world}) {
    const int n = comm->size();
    const int r = comm->rank();
    for (size_t recv_count : counts(n)) {
      std::vector<float> input(recv_count * n);
      for (size_t i = 0; i < input.size(); ++i) input[i] = exact_value(r, i);
      DeviceFloats send(input), recv(recv_count), in_place(input);
      comm->reduce_scatter(send.get(), recv.get(), recv_count, ReduceOp::sum, "rs").wait();
      comm->reduce_scatter(in_place.get(), in_place.get() + r * recv_count, recv_count,
                           ReduceOp::sum, "rs in place")
          .wait();
      const auto separate = recv.download();
      const auto whole = in_place.download();
      for (size_t j = 0; j < recv_count; ++j) {
        const size_t i = r * recv_count + j;
        const float expected = static_cast<float>(i % 13 + 1) * n * (n + 1) / 2;
        ASSERT_EQ(separate[j], expected) << "ordered " << comm->ordered() << " j " << j;
        ASSERT_EQ(whole[i], expected) << "in place, ordered " << comm->ordered() << " j " << j;
      }
    }
  }
#endif
}

TEST(NcclCollectives, OrderedReduceScatterAndBf16WireAreTheRankOrderSumBitwise) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  // bf16 wire takes the ordered path on both communicators; fp32 on the ordered one.
  struct Case {
    NcclCommunicator* comm;
    WireType wire;
  };
  for (const Case& k : {Case{ordered_world, WireType::fp32}, Case{ordered_world, WireType::bf16},
                        Case{world, WireType::bf16}}) {
    const int n = k.comm->size();
    const int r = k.comm->rank();
    const size_t recv_count = 3001;
    std::vector<float> input(recv_count * n);
    for (size_t i = 0; i < input.size(); ++i) input[i] = noisy_value(r, i);
    auto travel = [&](float v) { return k.wire == WireType::bf16 ? round_to(DType::bf16, v) : v; };
    std::vector<float> expected(recv_count);
    for (size_t j = 0; j < recv_count; ++j) {
      const size_t i = r * recv_count + j;
      float acc = travel(noisy_value(0, i));
      for (int q = 1; q < n; ++q) acc += travel(noisy_value(q, i));
      expected[j] = acc;
    }
    DeviceFloats send(input), recv(recv_count);
    k.comm->reduce_scatter(send.get(), recv.get(), recv_count, ReduceOp::sum, "rs ordered", k.wire)
        .wait();
    const auto got = recv.download();
    ASSERT_EQ(std::memcmp(got.data(), expected.data(), recv_count * sizeof(float)), 0)
        << "ordered communicator " << k.comm->ordered() << ", wire "
        << (k.wire == WireType::bf16 ? "bf16" : "fp32");
  }
#endif
}

TEST(NcclCollectives, AllGatherSeparateAndInPlace) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  const int n = world->size();
  const int r = world->rank();
  for (size_t count : counts(n)) {
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = exact_value(r, i);
    std::vector<float> whole(count * n, -1.0f);
    for (size_t i = 0; i < count; ++i) whole[r * count + i] = mine[i];
    DeviceFloats send(mine), recv(count * n), in_place(whole);
    world->all_gather(send.get(), recv.get(), count, "ag").wait();
    world->all_gather(in_place.get() + r * count, in_place.get(), count, "ag in place").wait();
    const auto a = recv.download();
    const auto b = in_place.download();
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(a[q * count + i], exact_value(q, i)) << "rank " << q << " i " << i;
        ASSERT_EQ(b[q * count + i], exact_value(q, i)) << "in place, rank " << q << " i " << i;
      }
  }
#endif
}

TEST(NcclCollectives, BroadcastFromEveryRootAndBarrier) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  const int n = world->size();
  for (int root = 0; root < n; ++root) {
    std::vector<float> mine(777);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = exact_value(world->rank(), i);
    DeviceFloats data(mine);
    world->broadcast(data.get(), mine.size() * sizeof(float), root, "bcast").wait();
    const auto got = data.download();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], exact_value(root, i)) << root;
  }
  world->barrier("barrier").wait();
  // Zero-sized collectives need no communication and are done at once.
  EXPECT_TRUE(world->all_reduce(nullptr, 0, ReduceOp::sum, "empty").is_done());
#endif
}

TEST(NcclCollectives, CollectiveWaitsForTheComputeStreamAndAConsumerStreamWaitsForIt) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  cudaStream_t compute = nullptr;
  cudaStream_t consumer = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "compute stream");
  check_cuda(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), "consumer stream");
  void* previous = world->compute_stream();
  world->set_compute_stream(compute);
  const size_t count = 1 << 16;
  std::vector<float> input(count);
  for (size_t i = 0; i < count; ++i) input[i] = exact_value(world->rank(), i);
  float* pinned_in = nullptr;
  float* pinned_out = nullptr;
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&pinned_in), count * sizeof(float)), "pinned");
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&pinned_out), count * sizeof(float)), "pinned");
  std::memcpy(pinned_in, input.data(), count * sizeof(float));
  DeviceFloats data(count);
  // The compute stream zeroes the buffer, is held back by a host function, then
  // writes the input: a collective that did not wait for it would reduce the zeros.
  check_cuda(cudaMemsetAsync(data.get(), 0, count * sizeof(float), compute), "memset");
  check_cuda(cudaLaunchHostFunc(compute, [](void*) {
               std::this_thread::sleep_for(std::chrono::milliseconds(50));
             }, nullptr), "cudaLaunchHostFunc");
  check_cuda(cudaMemcpyAsync(data.get(), pinned_in, count * sizeof(float), cudaMemcpyHostToDevice,
                             compute), "copy in");
  Work work = world->all_reduce(data.get(), count, ReduceOp::sum, "after compute");
  work.wait_on_stream(consumer);  // the host does not wait here
  EXPECT_TRUE(work.observed());
  check_cuda(cudaMemcpyAsync(pinned_out, data.get(), count * sizeof(float), cudaMemcpyDeviceToHost,
                             consumer), "copy out");
  sync_within(consumer, 60);
  const int n = world->size();
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(pinned_out[i], static_cast<float>(i % 13 + 1) * n * (n + 1) / 2) << i;
  world->set_compute_stream(previous);
  (void)cudaFreeHost(pinned_in);
  (void)cudaFreeHost(pinned_out);
  (void)cudaStreamDestroy(compute);
  (void)cudaStreamDestroy(consumer);
#endif
}

TEST(NcclCollectives, HostBuffersGoThroughTheHostCommunicator) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  const int n = world->size();
  const int r = world->rank();
  std::vector<double> loss = {1.5 * (r + 1)};
  world->all_reduce_blocking(loss, ReduceOp::sum, "loss sum");
  EXPECT_EQ(loss[0], 1.5 * n * (n + 1) / 2);
  const auto ids = world->all_gather_u64(100 + r, "ids");
  for (int q = 0; q < n; ++q) EXPECT_EQ(ids[q], static_cast<uint64_t>(100 + q));
  std::string text = r == 0 ? "{\"config\": 1}" : "";
  world->broadcast_string(text, 0, "config");
  EXPECT_EQ(text, "{\"config\": 1}");
  std::vector<float> host(5, static_cast<float>(r + 1));
  world->all_reduce(host.data(), host.size(), ReduceOp::max, "host max").wait();
  EXPECT_EQ(host[4], static_cast<float>(n));
  // A host buffer and a device buffer in one collective: refused, naming it.
  DeviceFloats device(5 * n);
  try {
    world->all_gather(host.data(), device.get(), 5, "mixed").wait();
    FAIL() << "a host/device mix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather 'mixed'"), std::string::npos) << e.what();
  }
#endif
}

TEST(NcclCollectives, SplitGroupsReduceWithinTheirGroup) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  const int n = world->size();
  const int r = world->rank();
  // Reverse key: ranks of a group in descending world rank.
  auto group = world->split(r % 2, -r, "parity");
  int expected_size = 0;
  int expected_rank = 0;
  for (int q = 0; q < n; ++q)
    if (q % 2 == r % 2) {
      ++expected_size;
      if (q > r) ++expected_rank;
    }
  EXPECT_EQ(group->size(), expected_size);
  EXPECT_EQ(group->rank(), expected_rank);
  EXPECT_EQ(group->name(), "parity");
  DeviceFloats data(std::vector<float>(3, static_cast<float>(r + 1)));
  group->all_reduce(data.get(), 3, ReduceOp::sum, "group sum").wait();
  float expected = 0;
  for (int q = 0; q < n; ++q)
    if (q % 2 == r % 2) expected += static_cast<float>(q + 1);
  EXPECT_EQ(data.download()[2], expected);
  group->finalize();
#endif
}

TEST(NcclCollectives, CountersCountCallsBytesAndDeviceSeconds) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  world->take_counters();
  const size_t count = 1 << 20;
  DeviceFloats data(count);
  world->all_reduce(data.get(), count, ReduceOp::sum, "counted").wait();
  const CommCounters c = world->take_counters();
  EXPECT_EQ(c[CollectiveKind::all_reduce].calls, 1u);
  EXPECT_EQ(c[CollectiveKind::all_reduce].bytes, count * sizeof(float));
  EXPECT_GE(c[CollectiveKind::all_reduce].seconds, 0.0);
  EXPECT_GE(c.exposed_seconds, 0.0);
#endif
}

TEST(NcclCollectives, CollectiveAPeerNeverJoinsTimesOutNamedAndAborts) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks (N=1 is covered by test_comm_device_completion's fake events)";
  // A communicator of its own, since this one is aborted at the end.
  CommOptions options;
  options.timeout_seconds = 2;
  std::vector<std::string> lines;  // written by the watchdog thread, read after the wait
  std::mutex lines_mutex;
  NcclOptions nccl;
  nccl.on_timeout = [&](const std::string& line) {
    std::lock_guard lock(lines_mutex);
    lines.push_back(line);
  };
  auto doomed = NcclCommunicator::create(host_world->split(0, world->rank(), "doomed"), options, nccl);
  if (doomed->rank() == 1) {
    DeviceFloats data(std::vector<float>(16, 1.0f));
    Work work = doomed->all_reduce(data.get(), 16, ReduceOp::sum, "never joined by rank 0");
    const std::string expected =
        "rank 1: all_reduce 'never joined by rank 0' (#0 on doomed) did not finish within 2 s";
    try {
      work.wait();
      ADD_FAILURE() << "the collective finished without its peer";
    } catch (const CommTimeout& e) {
      EXPECT_EQ(std::string(e.what()), expected);
    }
    std::lock_guard lock(lines_mutex);
    EXPECT_EQ(lines, std::vector<std::string>{expected});
  }
  doomed->abort_nccl();  // rank 0's side too, so its destruction does not wait on it
  host_world->barrier("after the timeout test").wait();
  doomed->finalize();
#endif
}

#ifdef SHARDLM_WITH_CUDA
// What `sender` puts at element i of its block for `receiver` (exact in fp32).
float message_value(int sender, int receiver, size_t i) {
  return static_cast<float>(sender * 100000 + receiver * 1000 + static_cast<int>(i % 997));
}
size_t uneven_count(int p, int q, size_t scale) {
  return static_cast<size_t>((p * 3 + q * 5 + 1) % 4) * scale;
}
#endif

TEST(NcclExchange, AllToAllEqualAndUnevenSplitsOnDeviceAndHostBuffers) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  const int n = world->size();
  const int r = world->rank();
  for (size_t per_peer : {size_t{1}, size_t{37}, size_t{70000}}) {
    std::vector<float> input(per_peer * n);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < per_peer; ++i) input[q * per_peer + i] = message_value(r, q, i);
    DeviceFloats send(input), recv(per_peer * n);
    world->all_to_all(send.get(), recv.get(), per_peer, "ulysses q").wait();
    std::vector<float> host_recv(per_peer * n, -1.0f);
    world->all_to_all(input.data(), host_recv.data(), per_peer, "ulysses q on the host").wait();
    const auto got = recv.download();
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < per_peer; ++i) {
        ASSERT_EQ(got[p * per_peer + i], message_value(p, r, i)) << per_peer << " from " << p;
        ASSERT_EQ(host_recv[p * per_peer + i], message_value(p, r, i)) << "host, from " << p;
      }
  }
  std::vector<size_t> send_counts(n), recv_counts(n);
  std::vector<float> input;
  size_t total = 0;
  for (int q = 0; q < n; ++q) {
    send_counts[q] = uneven_count(r, q, 1000);
    recv_counts[q] = uneven_count(q, r, 1000);
    total += recv_counts[q];
    for (size_t i = 0; i < send_counts[q]; ++i) input.push_back(message_value(r, q, i));
  }
  DeviceFloats send(input), recv(std::vector<float>(total + 1, -1.0f));
  world->all_to_all_v(send.get(), send_counts, recv.get(), recv_counts, "moe dispatch").wait();
  const auto got = recv.download();
  size_t at = 0;
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < recv_counts[p]; ++i, ++at)
      ASSERT_EQ(got[at], message_value(p, r, i)) << "from " << p;
  EXPECT_EQ(got[total], -1.0f);
  EXPECT_GE(world->counters()[CollectiveKind::all_to_all_v].calls, 1u);
#endif
}

TEST(NcclExchange, RingOfSendRecvAndAPipelineOfSendsAndReceives) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  const int n = world->size();
  const int r = world->rank();
  const size_t block = 50000;
  std::vector<float> mine(block);
  for (size_t i = 0; i < block; ++i) mine[i] = message_value(r, r, i);
  DeviceFloats held(mine), incoming(block);
  // One step (N = 1: a ring of one, a copy to itself).
  world->send_recv(held.get(), block, (r + 1) % n, incoming.get(), block, (r - 1 + n) % n, "ring kv")
      .wait();
  const int prev = (r - 1 + n) % n;
  const auto got = incoming.download();
  for (size_t i = 0; i < block; ++i) ASSERT_EQ(got[i], message_value(prev, prev, i));
  if (n < 2) return;
  DeviceFloats activations(block);
  if (r > 0) {
    world->recv(activations.get(), block, r - 1, "activations").wait();
    const auto a = activations.download();
    for (size_t i = 0; i < block; ++i) ASSERT_EQ(a[i], message_value(r - 1, r - 1, i));
  }
  if (r < n - 1) world->send(held.get(), block, r + 1, "activations").wait();
#endif
}

TEST(NcclExchange, ARecvWhoseSenderNeverSendsTimesOutNamingThePeer) {
  SKIP_WITHOUT_NCCL();
#ifdef SHARDLM_WITH_CUDA
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CommOptions options;
  options.timeout_seconds = 2;
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  NcclOptions nccl;
  nccl.on_timeout = [&](const std::string& line) {
    std::lock_guard lock(lines_mutex);
    lines.push_back(line);
  };
  auto doomed = NcclCommunicator::create(host_world->split(0, world->rank(), "doomed p2p"), options, nccl);
  if (doomed->rank() == 1) {
    DeviceFloats data(16);
    Work work = doomed->recv(data.get(), 16, 0, "activations micro 0");
    const std::string expected =
        "rank 1: recv 'activations micro 0' (#0 from rank 0 on doomed p2p) did not finish within 2 s";
    try {
      work.wait();
      ADD_FAILURE() << "the receive finished without a sender";
    } catch (const CommTimeout& e) {
      EXPECT_EQ(std::string(e.what()), expected);
    }
    std::lock_guard lock(lines_mutex);
    EXPECT_EQ(lines, std::vector<std::string>{expected});
  }
  doomed->abort_nccl();
  host_world->barrier("after the p2p timeout test").wait();
  doomed->finalize();
#endif
}

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  using namespace shardlm;
  testing::InitGoogleTest(&argc, argv);
  CommOptions options;
  options.timeout_seconds = 60;  // a bug that hangs ends the job well inside CTest's limit
  // MPI under a launcher, else the single-process communicator (make_world_communicator's
  // rule): started alone, as on a GPU machine without Open MPI's runtime files, the test
  // runs at N=1 without initialising MPI.
  std::unique_ptr<Communicator> host = make_world_communicator(options);
  host_world = host.get();
  const int rank = host->rank();
#ifdef SHARDLM_WITH_CUDA
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) {
    gpus = 0;
    (void)cudaGetLastError();
  }
  std::vector<int64_t> fewest = {gpus};
  host->all_reduce_blocking(fewest, ReduceOp::min, "visible GPUs");
  if (fewest[0] == 0)
    skip_reason = "no GPU visible (cudaGetDeviceCount reports 0)";
  else if (fewest[0] < host->size())
    skip_reason = std::to_string(host->size()) + " ranks need " + std::to_string(host->size()) +
                  " GPUs; " + std::to_string(fewest[0]) + " visible";
  std::unique_ptr<NcclCommunicator> ordered, nccl_world;
  if (skip_reason.empty()) {
    NcclOptions ordered_options;
    ordered_options.ordered = true;
    ordered = NcclCommunicator::create(host->split(0, rank, "ordered world"), options, ordered_options);
    nccl_world = NcclCommunicator::create(std::move(host), options);
    ordered_world = ordered.get();
    world = nccl_world.get();
    host_world = &nccl_world->host();
  }
#else
  skip_reason = "built without CUDA (SHARDLM_WITH_CUDA undefined)";
#endif
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  std::vector<int64_t> failed = {RUN_ALL_TESTS() != 0 ? 1 : 0};
  host_world->all_reduce_blocking(failed, ReduceOp::max, "test results");
#ifdef SHARDLM_WITH_CUDA
  if (ordered) ordered->finalize();
  ordered.reset();  // a split of the host world: gone before it
  if (nccl_world) nccl_world->finalize();
#endif
  if (host) host->finalize();
  if (rank == 0) {
    if (!skip_reason.empty()) std::printf("NCCL tests skipped: %s\n", skip_reason.c_str());
    std::printf("%s on every rank\n", failed[0] ? "FAILED" : "passed");
  }
  return static_cast<int>(failed[0]);
}
