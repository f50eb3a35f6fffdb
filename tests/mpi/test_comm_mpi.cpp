// Multi-rank tests of MpiCommunicator, run by CTest as `mpirun -n N mpi_test_comm
// [--check-sequence] [--start-on-wait]`. Every rank runs every test; expectations are computed from
// formulas (integer-valued floats, so sums are exact) or from an independent scalar
// reduction of all ranks' inputs, never from the communicator's own output alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/comm/mpi_algorithms.hpp"
#include "shardlm/comm/mpi_communicator.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/sha256.hpp"

namespace shardlm {
namespace {

Communicator* world = nullptr;

// Small scratch, so modest buffers already take several reduce-scatter chunks.
constexpr size_t kScratchBytes = 48 << 10;

// Rank r's value for element i of a buffer: small integers, exact in float sums.
float value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}

std::vector<size_t> interesting_counts(int n) {
  const size_t chunk = kScratchBytes / sizeof(float) / std::max(1, n - 1);
  return {0,
          1,
          static_cast<size_t>(n) - 1,
          static_cast<size_t>(n) * 5 + 1,
          4096,
          static_cast<size_t>(n) * chunk * 2 + 3};
}

TEST(MpiCollectives, AllReduceSumMaxMinAreExact) {
  const int n = world->size();
  const int r = world->rank();
  for (size_t count : interesting_counts(n)) {
    std::vector<float> sum(count), max(count), min(count);
    for (size_t i = 0; i < count; ++i) sum[i] = max[i] = min[i] = value(r, i);
    Work a = world->all_reduce(sum.data(), count, ReduceOp::sum, "sum");
    Work b = world->all_reduce(max.data(), count, ReduceOp::max, "max");
    Work c = world->all_reduce(min.data(), count, ReduceOp::min, "min");
    a.wait();
    b.wait();
    c.wait();
    for (size_t i = 0; i < count; ++i) {
      const float base = static_cast<float>(i % 13 + 1);
      ASSERT_EQ(sum[i], base * n * (n + 1) / 2) << "count " << count << " i " << i;
      ASSERT_EQ(max[i], base * n) << "count " << count << " i " << i;
      ASSERT_EQ(min[i], base) << "count " << count << " i " << i;
    }
  }
}

TEST(MpiCollectives, ReduceScatterIsExactSeparateAndInPlace) {
  const int n = world->size();
  const int r = world->rank();
  for (size_t recv_count : interesting_counts(n)) {
    std::vector<float> send(recv_count * n);
    for (size_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
    std::vector<float> recv(recv_count, -1.0f);
    world->reduce_scatter(send.data(), recv.data(), recv_count, ReduceOp::sum, "rs").wait();
    world
        ->reduce_scatter(send.data(), send.data() + r * recv_count, recv_count, ReduceOp::sum,
                         "rs in place")
        .wait();
    for (size_t j = 0; j < recv_count; ++j) {
      const size_t i = r * recv_count + j;
      const float expected = static_cast<float>(i % 13 + 1) * n * (n + 1) / 2;
      ASSERT_EQ(recv[j], expected) << "recv_count " << recv_count << " j " << j;
      ASSERT_EQ(send[i], expected) << "in place, recv_count " << recv_count << " j " << j;
    }
  }
}

TEST(MpiCollectives, AllGatherIsExactSeparateAndInPlace) {
  const int n = world->size();
  const int r = world->rank();
  for (size_t count : interesting_counts(n)) {
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = value(r, i) + 1000.0f * r;
    std::vector<float> gathered(count * n, -1.0f);
    world->all_gather(mine.data(), gathered.data(), count, "ag").wait();
    std::vector<float> in_place(count * n, -1.0f);
    std::copy(mine.begin(), mine.end(), in_place.begin() + r * count);
    world->all_gather(in_place.data() + r * count, in_place.data(), count, "ag in place").wait();
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(gathered[p * count + i], value(p, i) + 1000.0f * p) << "count " << count;
        ASSERT_EQ(in_place[p * count + i], value(p, i) + 1000.0f * p) << "count " << count;
      }
  }
  // Odd byte counts through the byte interface.
  std::vector<char> bytes(7 * n, 0);
  std::vector<char> mine(7);
  for (int i = 0; i < 7; ++i) mine[i] = static_cast<char>('a' + r + i);
  world->all_gather_bytes(mine.data(), bytes.data(), 7, "bytes").wait();
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < 7; ++i) ASSERT_EQ(bytes[p * 7 + i], static_cast<char>('a' + p + i));
}

TEST(MpiCollectives, BroadcastFromTheLastRankAndStrings) {
  const int n = world->size();
  const int r = world->rank();
  const int root = n - 1;
  std::vector<uint8_t> data(100003);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(r == root ? i * 7 : 0);
  world->broadcast(data.data(), data.size(), root, "bytes").wait();
  for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<uint8_t>(i * 7));

  std::string config = r == 0 ? std::string(R"({"n_layer": 12, "name": "gpt2"})") : "stale";
  world->broadcast_string(config, 0, "config");
  EXPECT_EQ(config, R"({"n_layer": 12, "name": "gpt2"})");
  world->barrier("after broadcast").wait();
}

TEST(MpiCollectives, BlockingHelpers) {
  const int n = world->size();
  const int r = world->rank();
  std::vector<double> loss = {r + 0.5, -1.0 * r};
  world->all_reduce_blocking(loss, ReduceOp::sum, "loss sum");
  EXPECT_EQ(loss[0], n * (n - 1) / 2.0 + 0.5 * n);
  EXPECT_EQ(loss[1], -n * (n - 1) / 2.0);
  std::vector<int64_t> tokens = {(int64_t{1} << 40) + r, -r};
  world->all_reduce_blocking(tokens, ReduceOp::max, "tokens max");
  EXPECT_EQ(tokens[0], (int64_t{1} << 40) + n - 1);
  EXPECT_EQ(tokens[1], 0);
  const auto digests = world->all_gather_u64(uint64_t(r) * r + 7, "digests");
  ASSERT_EQ(digests.size(), static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) EXPECT_EQ(digests[p], uint64_t(p) * p + 7);
}

// Scalar rank-order sum of every rank's inputs: the documented order, computed here
// independently of the communicator's algorithms.
std::vector<float> reference_sum(const std::vector<float>& all_ranks, int n, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    float acc = all_ranks[i];
    for (int p = 1; p < n; ++p) acc = acc + all_ranks[p * count + i];
    out[i] = acc;
  }
  return out;
}

TEST(MpiCollectives, RandomFloatsAreBitwiseTheSameHoweverTheyAreReduced) {
  const int n = world->size();
  const int r = world->rank();
  const size_t block = 9001;  // several chunks of the small scratch
  const size_t count = block * n;
  Rng rng(1234 + r);
  std::vector<float> mine(count);
  for (auto& x : mine) x = static_cast<float>(rng.normal() * std::pow(10.0, rng.below(7) - 3.0));

  // 1. One all-reduce of the whole buffer.
  std::vector<float> whole = mine;
  world->all_reduce(whole.data(), count, ReduceOp::sum, "whole").wait();
  // 2. The same buffer as two all-reduces split at an unaligned point.
  std::vector<float> halves = mine;
  const size_t cut = count / 3 + 1;
  Work first = world->all_reduce(halves.data(), cut, ReduceOp::sum, "first part");
  Work second = world->all_reduce(halves.data() + cut, count - cut, ReduceOp::sum, "second part");
  first.wait();
  second.wait();
  // 3. reduce-scatter, then all-gather of the owned blocks (the sharded strategies).
  std::vector<float> sharded = mine;
  world->reduce_scatter(sharded.data(), sharded.data() + r * block, block, ReduceOp::sum, "rs")
      .wait();
  world->all_gather(sharded.data() + r * block, sharded.data(), block, "ag").wait();
  // 4. The independent reference from every rank's inputs.
  std::vector<float> everyone(count * n);
  world->all_gather(mine.data(), everyone.data(), count, "inputs").wait();
  const std::vector<float> expected = reference_sum(everyone, n, count);

  EXPECT_EQ(0, std::memcmp(whole.data(), expected.data(), count * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(halves.data(), expected.data(), count * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(sharded.data(), expected.data(), count * sizeof(float)));
  // Every rank holds the same bits.
  const uint64_t head =
      std::stoull(sha256_hex(whole.data(), count * sizeof(float)).substr(0, 16), nullptr, 16);
  for (uint64_t d : world->all_gather_u64(head, "result digest")) EXPECT_EQ(d, head);
}

// The bf16 wire: every rank's values (its own too) rounded to bf16, summed in fp32
// in rank order; reference computed here from every rank's fp32 inputs with a
// rounding written from the definition (nearest, ties to even). Separate and in
// place, over several scratch chunks; bytes counted at 2 per element.
TEST(MpiCollectives, ReduceScatterOnTheBf16WireSumsRoundedValuesInRankOrder) {
  const int n = world->size();
  const int r = world->rank();
  const auto round_bf16 = [](float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint32_t lower = bits & 0xffffu;
    uint32_t upper = bits & 0xffff0000u;
    if (lower > 0x8000u || (lower == 0x8000u && (upper & 0x10000u))) upper += 0x10000u;
    float y;
    std::memcpy(&y, &upper, 4);
    return y;
  };
  for (size_t block : {size_t{1}, size_t{7}, size_t{9001}}) {
    const size_t count = block * n;
    Rng rng(77 + r);
    std::vector<float> mine(count);
    for (auto& x : mine) x = static_cast<float>(rng.normal() * std::pow(10.0, rng.below(5) - 2.0));
    std::vector<float> everyone(count * n);
    world->all_gather(mine.data(), everyone.data(), count, "inputs").wait();
    std::vector<float> expected(block);
    for (size_t j = 0; j < block; ++j) {
      float acc = round_bf16(everyone[r * block + j]);
      for (int q = 1; q < n; ++q) acc += round_bf16(everyone[q * count + r * block + j]);
      expected[j] = acc;
    }
    world->take_counters();
    std::vector<float> recv(block, -1.0f);
    world->reduce_scatter(mine.data(), recv.data(), block, ReduceOp::sum, "rs bf16", WireType::bf16)
        .wait();
    EXPECT_EQ(world->take_counters()[CollectiveKind::reduce_scatter].bytes, count * 2);
    std::vector<float> in_place = mine;
    world
        ->reduce_scatter(in_place.data(), in_place.data() + r * block, block, ReduceOp::sum,
                         "rs bf16 in place", WireType::bf16)
        .wait();
    EXPECT_EQ(0, std::memcmp(recv.data(), expected.data(), block * sizeof(float))) << block;
    EXPECT_EQ(0, std::memcmp(in_place.data() + r * block, expected.data(), block * sizeof(float)))
        << block;
    // The wire really is bf16: the fp32 reduction of the same inputs differs.
    if (block > 1000) {
      std::vector<float> fp32 = mine;
      world->reduce_scatter(fp32.data(), fp32.data() + r * block, block, ReduceOp::sum, "rs fp32")
          .wait();
      EXPECT_NE(0, std::memcmp(fp32.data() + r * block, expected.data(), block * sizeof(float)));
    }
  }
}

TEST(MpiCollectives, CountersCountCallsBytesAndTime) {
  const int n = world->size();
  std::vector<float> data(1000 * n);
  world->barrier("settle").wait();
  world->take_counters();
  world->all_reduce(data.data(), 1000, ReduceOp::sum, "ar").wait();
  world->reduce_scatter(data.data(), data.data() + world->rank() * 100, 100, ReduceOp::sum, "rs")
      .wait();
  world->all_gather(data.data(), data.data() + 200 * n, 200, "ag").wait();
  world->broadcast(data.data(), 10, 0, "bc").wait();
  world->barrier("b").wait();
  const CommCounters c = world->take_counters();
  const auto ar = c[CollectiveKind::all_reduce];
  const auto rs = c[CollectiveKind::reduce_scatter];
  const auto ag = c[CollectiveKind::all_gather];
  EXPECT_EQ(ar.calls, 1u);
  EXPECT_EQ(ar.bytes, 4000u);
  EXPECT_EQ(ar.bus_bytes, 2u * 4000u * (n - 1) / n);
  EXPECT_EQ(rs.bytes, 400u * n);
  EXPECT_EQ(rs.bus_bytes, 400u * (n - 1));
  EXPECT_EQ(ag.bytes, 800u * n);
  EXPECT_EQ(c[CollectiveKind::broadcast].bytes, 10u);
  EXPECT_EQ(c[CollectiveKind::barrier].calls, 1u);
  EXPECT_EQ(c.total().calls, 5u);
  for (auto kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                    CollectiveKind::all_gather, CollectiveKind::barrier})
    EXPECT_GT(c[kind].seconds, 0.0) << to_string(kind);
  EXPECT_GT(c.exposed_seconds, 0.0);
  EXPECT_EQ(world->counters().total().calls, 0u);
}

TEST(MpiCollectives, SplitFormsShardAndReplicaGroups) {
  const int n = world->size();
  const int r = world->rank();
  // Hybrid layout: shard groups of 2 consecutive ranks, replica groups across them.
  auto shard = world->split(r / 2, r, "shard group");
  auto replica = world->split(r % 2, r, "replica group");
  EXPECT_EQ(shard->rank(), r % 2);
  EXPECT_EQ(shard->size(), std::min(2, n - (r / 2) * 2));
  EXPECT_EQ(replica->rank(), r / 2);
  EXPECT_EQ(replica->name(), "replica group");

  std::vector<double> ranks_in_shard = {static_cast<double>(r)};
  shard->all_reduce_blocking(ranks_in_shard, ReduceOp::sum, "shard sum");
  double expected = 0;
  for (int p = (r / 2) * 2; p < std::min(n, (r / 2) * 2 + 2); ++p) expected += p;
  EXPECT_EQ(ranks_in_shard[0], expected);

  std::vector<float> data(6, static_cast<float>(r + 1));
  replica->all_reduce(data.data(), data.size(), ReduceOp::sum, "replica sum").wait();
  float replica_expected = 0;
  for (int p = r % 2; p < n; p += 2) replica_expected += static_cast<float>(p + 1);
  EXPECT_EQ(data[0], replica_expected);
  EXPECT_EQ(replica->counters()[CollectiveKind::all_reduce].calls, 1u);
}

TEST(MpiCollectives, FinalizeReportsCollectivesNeverWaitedFor) {
  auto group = world->split(0, world->rank(), "leaky group");
  Work done = group->barrier("waited barrier");
  done.wait();
  group->barrier("forgotten barrier");  // dropped without wait
  try {
    group->finalize();
    FAIL() << "finalize() should report the forgotten barrier";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank " + std::to_string(world->rank()) +
                           ": 1 collective(s) on leaky group were never waited for: barrier "
                           "'forgotten barrier' (#1 on leaky group)"),
              std::string::npos)
        << message;
  }
}

TEST(MpiCollectives, SequenceCheckFailsEveryRankWhenRanksFallOutOfStep) {
  if (!world->options().check_sequence) GTEST_SKIP() << "needs --check-sequence";
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto group = world->split(0, world->rank(), "checked group");
  std::vector<float> data(16, 1.0f);
  // Rank 0 skipped the gradient bucket the others reduce first: same size, so without
  // the check MPI would silently pair the wrong buffers.
  const char* label = group->rank() == 0 ? "gradients bucket 1" : "gradients bucket 0";
  try {
    group->all_reduce(data.data(), data.size(), ReduceOp::sum, label).wait();
    FAIL() << "the sequence check should have failed";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(
        message.find("collectives out of step on checked group: rank 0 of checked group issued "
                     "all_reduce 'gradients bucket 1' (#0, 64 bytes, sum) but rank 1 issued "
                     "all_reduce 'gradients bucket 0' (#0, 64 bytes, sum)"),
        std::string::npos)
        << message;
  }
  EXPECT_EQ(data[0], 1.0f);  // the collective itself never ran
  // Everything after fails at once on every rank instead of deadlocking.
  EXPECT_THROW(group->barrier("next").wait(), Error);
}

// --- all-to-all and point-to-point ---

// What `sender` puts at element i of its block for `receiver` (exact in fp32).
float message_value(int sender, int receiver, size_t i) {
  return static_cast<float>(sender * 100000 + receiver * 1000 + static_cast<int>(i % 997));
}

// Elements rank p sends rank q in the uneven cases: zeros included.
size_t uneven_count(int p, int q, size_t scale) {
  return static_cast<size_t>((p * 3 + q * 5 + 1) % 4) * scale;
}

TEST(MpiExchange, AllToAllIsExactForEqualAndUnevenSplits) {
  const int n = world->size();
  const int r = world->rank();
  for (size_t per_peer : {size_t{0}, size_t{1}, size_t{37}, size_t{70000}}) {
    std::vector<float> send(per_peer * n), recv(per_peer * n, -1.0f);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < per_peer; ++i) send[q * per_peer + i] = message_value(r, q, i);
    world->all_to_all(send.data(), recv.data(), per_peer, "ulysses q").wait();
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < per_peer; ++i)
        ASSERT_EQ(recv[p * per_peer + i], message_value(p, r, i)) << per_peer << " from " << p;
  }
  for (size_t scale : {size_t{1}, size_t{5000}}) {
    std::vector<size_t> send_counts(n), recv_counts(n);
    std::vector<float> send;
    for (int q = 0; q < n; ++q) {
      send_counts[q] = uneven_count(r, q, scale);
      recv_counts[q] = uneven_count(q, r, scale);
      for (size_t i = 0; i < send_counts[q]; ++i) send.push_back(message_value(r, q, i));
    }
    size_t total = 0;
    for (size_t c : recv_counts) total += c;
    std::vector<float> recv(total + 1, -1.0f);
    world->all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, "moe dispatch").wait();
    size_t at = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < recv_counts[p]; ++i, ++at)
        ASSERT_EQ(recv[at], message_value(p, r, i)) << "scale " << scale << " from " << p;
    EXPECT_EQ(recv[total], -1.0f);
  }
  // bf16 elements travel as they are, at 2 bytes each.
  std::vector<uint16_t> h(3 * n), g(3 * n, 0);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(r * 256 + i);
  world->take_counters();
  world->all_to_all(ConstTypedPtr(h.data(), DType::bf16), TypedPtr(g.data(), DType::bf16), 3,
                    "bf16 a2a")
      .wait();
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < 3; ++i) ASSERT_EQ(g[p * 3 + i], p * 256 + r * 3 + i);
  EXPECT_EQ(world->take_counters()[CollectiveKind::all_to_all].bytes, 6u * n);
}

TEST(MpiExchange, RingOfSendRecvAndAPipelineOfSendsAndReceives) {
  const int n = world->size();
  const int r = world->rank();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  // Ring: uneven block sizes (origin k has (k + 1) * 3000 elements) travel round.
  const auto block_size = [](int k) { return static_cast<size_t>(k + 1) * 3000; };
  std::vector<float> held(block_size(r));
  for (size_t i = 0; i < held.size(); ++i) held[i] = message_value(r, r, i);
  for (int step = 1; step < n; ++step) {
    const int origin = (r - step + n) % n;
    std::vector<float> incoming(block_size(origin), -1.0f);
    world->send_recv(held.data(), held.size(), next, incoming.data(), incoming.size(), prev,
                     "ring kv")
        .wait();
    for (size_t i = 0; i < incoming.size(); ++i)
      ASSERT_EQ(incoming[i], message_value(origin, origin, i)) << "step " << step;
    held = std::move(incoming);
  }
  // Pipeline 0 -> 1 -> ... -> n-1, two micro-batches, collectives in between.
  world->take_counters();
  const uint64_t collectives_before = world->next_sequence();
  std::vector<float> activations(20000);
  for (int micro = 0; micro < 2; ++micro) {
    if (r > 0) {
      world->recv(activations.data(), activations.size(), r - 1, "activations").wait();
      for (size_t i = 0; i < activations.size(); ++i)
        ASSERT_EQ(activations[i], message_value(r - 1, micro, i));
    }
    if (r < n - 1) {
      for (size_t i = 0; i < activations.size(); ++i) activations[i] = message_value(r, micro, i);
      world->send(activations.data(), activations.size(), r + 1, "activations").wait();
    }
    world->barrier("micro-batch done").wait();
  }
  EXPECT_EQ(world->next_sequence(), collectives_before + 2);  // only the barriers
  const CommCounters c = world->take_counters();
  EXPECT_EQ(c[CollectiveKind::send].calls, r < n - 1 ? 2u : 0u);
  EXPECT_EQ(c[CollectiveKind::send].bytes, r < n - 1 ? 2u * 80000 : 0u);
  EXPECT_EQ(c[CollectiveKind::send].messages, r < n - 1 ? 2u : 0u);
  EXPECT_EQ(c[CollectiveKind::recv].bytes, r > 0 ? 2u * 80000 : 0u);
  EXPECT_EQ(c[CollectiveKind::recv].bus_bytes, 0u);
  EXPECT_GT(c[CollectiveKind::barrier].seconds + c[CollectiveKind::send].seconds, 0.0);
}

TEST(MpiExchange, AlgorithmsChunkMessagesAndNameAPeerThatSentLessThanExpected) {
  // Straight on a communicator of its own (MPI_THREAD_MULTIPLE: legal beside the
  // communication thread, which never touches this one).
  const int n = world->size();
  const int r = world->rank();
  MPI_Comm comm;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  std::vector<char> send, recv;
  for (int q = 0; q < n; ++q) {
    send_bytes[q] = uneven_count(r, q, 11);
    recv_bytes[q] = uneven_count(q, r, 11);
    for (size_t i = 0; i < send_bytes[q]; ++i) send.push_back(static_cast<char>(r * 16 + q + i));
  }
  size_t total = 0;
  for (size_t b : recv_bytes) total += b;
  recv.assign(total, 0);
  mpi::all_to_all_v(comm, send.data(), send_bytes.data(), recv.data(), recv_bytes.data(),
                    /*chunk_bytes=*/7);
  size_t at = 0;
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < recv_bytes[p]; ++i, ++at)
      ASSERT_EQ(recv[at], static_cast<char>(p * 16 + r + i));
  // Rank 0 sends rank 1 five bytes where eight are expected: rank 1 names it.
  if (r < 2 && n >= 2) {
    char buffer[8] = {};
    try {
      mpi::send_recv(comm, buffer, r == 0 ? 5 : 0, r == 0 ? 1 : -1, buffer, r == 1 ? 8 : 0,
                     r == 1 ? 0 : -1);
      EXPECT_EQ(r, 0) << "rank 1 should have failed";
    } catch (const Error& e) {
      EXPECT_EQ(r, 1);
      EXPECT_EQ(std::string(e.what()),
                "rank 0 sent 5 bytes where 8 were expected (the two sides' counts disagree)");
    }
  }
  MPI_Barrier(comm);
  MPI_Comm_free(&comm);
}

TEST(MpiExchange, CheckModeFailsEveryRankOnCountsOrMessagesThatDisagree) {
  if (!world->options().check_sequence) GTEST_SKIP() << "needs --check-sequence";
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int n = world->size();
  const int r = world->rank();
  {
    auto group = world->split(0, r, "a2a group");
    // Rank 0 sends 2 elements to rank 1, which expects 3; the rest send 1 to everyone.
    std::vector<size_t> send_counts(n, 1), recv_counts(n, 1);
    if (r == 0) send_counts[1] = 2;
    if (r == 1) recv_counts[0] = 3;
    std::vector<float> send(n + 1), recv(n + 2, -1.0f);
    try {
      group->all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, "moe combine").wait();
      FAIL() << "the counts check should have failed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "counts disagree on a2a group: rank 0 sends 2 elements to rank 1 but rank 1 "
                    "expects 3 from rank 0"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(recv[0], -1.0f);  // nothing moved
  }
  {
    auto group = world->split(0, r, "p2p group");
    std::vector<float> x(6, 1.0f);
    if (r < 2) {
      try {
        if (r == 0)
          group->send(x.data(), 4, 1, "kv block").wait();
        else
          group->recv(x.data(), 4, 0, "kv block 2").wait();
        FAIL() << "the message check should have failed";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(
                      "point-to-point out of step on p2p group: rank 0 sent 'kv block' (#0 to "
                      "rank 1, 16 bytes, fp32) but rank 1 expects 'kv block 2' (#0 from rank 0, "
                      "16 bytes, fp32)"),
                  std::string::npos)
            << e.what();
      }
    }
    // A disagreeing pair does not stop the group's collectives.
    group->barrier("after the pair").wait();
  }
}

// Prints failures from ranks other than 0 (rank 0 keeps the normal gtest output).
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
  testing::InitGoogleTest(&argc, argv);
  shardlm::CommOptions options;
  options.timeout_seconds = 60;  // a bug that hangs aborts the job well inside CTest's limit
  options.scratch_bytes = shardlm::kScratchBytes;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--check-sequence")
      options.check_sequence = true;
    else if (std::string(argv[i]) == "--start-on-wait")
      options.overlap = false;
  auto world = shardlm::MpiCommunicator::create_world(options);
  shardlm::world = world.get();
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (world->rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new shardlm::RankFailurePrinter(world->rank()));
  }
  std::vector<int64_t> failed = {RUN_ALL_TESTS() != 0 ? 1 : 0};
  world->all_reduce_blocking(failed, shardlm::ReduceOp::max, "test results");
  world->finalize();
  if (world->rank() == 0) std::printf("%s on every rank\n", failed[0] ? "FAILED" : "passed");
  return static_cast<int>(failed[0]);
}
