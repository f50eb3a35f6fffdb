// The in-process communicator (N ranks on N threads) against naive references: every
// collective on 2, 3 and 4 ranks, in place and not, fp32 and bf16 on the wire, in rank
// order; groups from split; and the failure paths the strategies' tests rely on:
// collectives out of step, a rank that never arrives (deadline), abort, an injected
// failure, a collective never waited for.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "shardlm/comm/in_process_communicator.hpp"

namespace shardlm {
namespace {

// Values whose float sums depend on the order they are added in.
float value(int rank, size_t i) {
  const float magnitude = rank == 0 ? 1e8f : 1.0f + 0.25f * static_cast<float>(rank);
  return (i % 2 ? -magnitude : magnitude) + static_cast<float>(i % 5);
}

float naive_reduce(int ranks, size_t i, ReduceOp op, const std::function<float(int)>& x) {
  float acc = x(0);
  for (int r = 1; r < ranks; ++r) {
    const float v = x(r);
    acc = op == ReduceOp::sum ? acc + v : op == ReduceOp::max ? std::max(acc, v) : std::min(acc, v);
  }
  (void)i;
  return acc;
}

// Round to nearest even at bit 16, for finite values (the reference for bf16 wires).
float naive_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(InProcessCommunicator, AllReduceCombinesInRankOrder) {
  for (int n : {2, 3, 4})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      InProcessJob job(n);
      const size_t count = 4099;  // more than one reduction tile, odd
      std::vector<std::vector<float>> results(static_cast<size_t>(n));
      expect_no_errors(job.run([&](Communicator& comm) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i);
        comm.all_reduce(data.data(), count, op, "grads").wait();
        results[static_cast<size_t>(comm.rank())] = data;
      }));
      for (size_t i = 0; i < count; ++i) {
        const float want = naive_reduce(n, i, op, [&](int r) { return value(r, i); });
        for (int r = 0; r < n; ++r)
          ASSERT_EQ(results[static_cast<size_t>(r)][i], want) << "n " << n << " rank " << r << " i " << i;
      }
    }
}

TEST(InProcessCommunicator, ReduceScatterInPlaceOrNotFp32OrBf16) {
  for (int n : {2, 3, 4})
    for (WireType wire : {WireType::fp32, WireType::bf16})
      for (bool in_place : {true, false}) {
        InProcessJob job(n);
        const size_t block = 37;
        std::vector<std::vector<float>> results(static_cast<size_t>(n));
        expect_no_errors(job.run([&](Communicator& comm) {
          std::vector<float> send(block * static_cast<size_t>(n));
          for (size_t i = 0; i < send.size(); ++i) send[i] = value(comm.rank(), i) * 1.001f;
          std::vector<float> separate(block);
          float* recv = in_place ? send.data() + static_cast<size_t>(comm.rank()) * block : separate.data();
          comm.reduce_scatter(send.data(), recv, block, ReduceOp::sum, "rs", wire).wait();
          results[static_cast<size_t>(comm.rank())].assign(recv, recv + block);
        }));
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < block; ++i) {
            const size_t e = static_cast<size_t>(r) * block + i;
            const float want = naive_reduce(n, e, ReduceOp::sum, [&](int p) {
              const float x = value(p, e) * 1.001f;
              return wire == WireType::bf16 ? naive_bf16(x) : x;
            });
            ASSERT_EQ(results[static_cast<size_t>(r)][i], want)
                << "n " << n << " rank " << r << " i " << i << " bf16 " << (wire == WireType::bf16);
          }
      }
}

TEST(InProcessCommunicator, AllGatherBroadcastBarrierAndHelpers) {
  for (int n : {2, 3, 4}) {
    InProcessJob job(n);
    expect_no_errors(job.run([&](Communicator& comm) {
      const int r = comm.rank();
      std::vector<float> gathered(static_cast<size_t>(3 * n));
      std::vector<float> mine = {float(r), float(10 * r), float(100 * r)};
      comm.all_gather(mine.data(), gathered.data(), 3, "ag").wait();
      std::vector<float> in_place(static_cast<size_t>(3 * n), -1.0f);
      std::copy(mine.begin(), mine.end(), in_place.begin() + 3 * r);
      comm.all_gather(in_place.data() + 3 * r, in_place.data(), 3, "ag in place").wait();
      for (int p = 0; p < n; ++p)
        for (int k = 0; k < 3; ++k) {
          const float want = static_cast<float>(p * (k == 0 ? 1 : k == 1 ? 10 : 100));
          if (gathered[static_cast<size_t>(3 * p + k)] != want ||
              in_place[static_cast<size_t>(3 * p + k)] != want)
            throw Error("all_gather wrong");
        }
      for (int root = 0; root < n; ++root) {
        char text[6] = "rankX";
        text[4] = static_cast<char>('0' + r);
        comm.broadcast(text, 6, root, "bc").wait();
        if (text[4] != '0' + root) throw Error("broadcast wrong");
      }
      comm.barrier("b").wait();
      std::vector<double> loss = {0.5 * (r + 1)};
      comm.all_reduce_blocking(loss, ReduceOp::sum, "loss");
      std::vector<int64_t> tokens = {r + 1};
      comm.all_reduce_blocking(tokens, ReduceOp::max, "tokens");
      if (loss[0] != 0.25 * n * (n + 1) || tokens[0] != n) throw Error("blocking helpers wrong");
      const auto digests = comm.all_gather_u64(1000 + static_cast<uint64_t>(r), "digest");
      for (int p = 0; p < n; ++p)
        if (digests[static_cast<size_t>(p)] != 1000 + static_cast<uint64_t>(p)) throw Error("u64 wrong");
      std::string config = r == 0 ? "{\"n_layer\": 2}" : "";
      comm.broadcast_string(config, 0, "config");
      if (config != "{\"n_layer\": 2}") throw Error("broadcast_string wrong");
    }));
  }
}

TEST(InProcessCommunicator, SplitFormsGroupsOrderedByKey) {
  InProcessJob job(4);
  std::vector<std::string> seen(4);
  expect_no_errors(job.run([&](Communicator& world) {
    const int r = world.rank();
    // Even and odd ranks; keys reverse the order inside each group.
    auto group = world.split(r % 2, -r, "parity");
    std::vector<float> x = {static_cast<float>(r)};
    group->all_reduce(x.data(), 1, ReduceOp::sum, "group sum").wait();
    auto pair = group->split(0, group->rank(), "copy");  // a split of a split
    pair->barrier("inner").wait();
    seen[static_cast<size_t>(r)] = fmt::format("{} {}/{} sum {} inner {}/{}", group->name(),
                                               group->rank(), group->size(), x[0], pair->rank(),
                                               pair->size());
    pair->finalize();
    group->finalize();
  }));
  EXPECT_EQ(seen[0], "parity 1/2 sum 2 inner 1/2");
  EXPECT_EQ(seen[2], "parity 0/2 sum 2 inner 0/2");
  EXPECT_EQ(seen[1], "parity 1/2 sum 4 inner 1/2");
  EXPECT_EQ(seen[3], "parity 0/2 sum 4 inner 0/2");
}

TEST(InProcessCommunicator, CollectivesOutOfStepFailOnEveryRank) {
  InProcessJob job(2);
  const auto errors = job.run([&](Communicator& comm) {
    std::vector<float> x(4);
    comm.all_reduce(x.data(), 4, ReduceOp::sum, comm.rank() == 0 ? "loss sum" : "grad norm").wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[static_cast<size_t>(r)],
              fmt::format("rank {}: all_reduce '{}' (#0 on world) failed: collectives out of step on "
                          "world: rank 0 of world issued all_reduce 'loss sum' (#0, 16 bytes, sum) "
                          "but rank 1 issued all_reduce 'grad norm' (#0, 16 bytes, sum)",
                          r, r == 0 ? "loss sum" : "grad norm"));
}

TEST(InProcessCommunicator, ARankThatNeverArrivesRunsIntoTheDeadline) {
  InProcessJob job(2, CommOptions{.timeout_seconds = 0.2});
  const auto errors = job.run([&](Communicator& comm) {
    if (comm.rank() == 1) return;  // busy elsewhere
    std::vector<float> x(8);
    comm.all_reduce(x.data(), 8, ReduceOp::sum, "gradients bucket 0").wait();
  });
  EXPECT_EQ(errors[0], "rank 0: timed out after 0.2 s waiting for all_reduce 'gradients bucket 0' (#0 on world)");
  EXPECT_EQ(errors[1], "");

  // The same from inside code a test cannot edit: the contribution is lost on the way.
  InProcessJob lossy(2, CommOptions{.timeout_seconds = 0.2});
  lossy.inject({.rank = 1, .label = "gradients bucket 0"});
  const auto both = lossy.run([&](Communicator& comm) {
    std::vector<float> x(8);
    comm.all_reduce(x.data(), 8, ReduceOp::sum, "gradients bucket 0").wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(both[static_cast<size_t>(r)],
              fmt::format("rank {}: timed out after 0.2 s waiting for all_reduce 'gradients bucket "
                          "0' (#0 on world)",
                          r));
}

TEST(InProcessCommunicator, AbortEndsEveryRankWithoutWaitingForTheDeadline) {
  InProcessJob job(3, CommOptions{.timeout_seconds = 600});
  const auto errors = job.run([&](Communicator& comm) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting
      comm.abort_job("error: loss became NaN at step 3");
    }
    comm.barrier("end of step 3").wait();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "rank 1: error: loss became NaN at step 3");
}

TEST(InProcessCommunicator, InjectedFailureFailsTheCollectiveOnEveryRank) {
  InProcessJob job(2);
  job.inject({.rank = 1, .label = "all_gather params unit h.0",
              .kind = InProcessFault::Kind::fails, .message = "connection reset"});
  const auto errors = job.run([&](Communicator& comm) {
    std::vector<float> full(8), mine(4, 1.0f);
    comm.all_gather(mine.data(), full.data(), 4, "all_gather params unit h.0").wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[static_cast<size_t>(r)],
              fmt::format("rank {}: all_gather 'all_gather params unit h.0' (#0 on world) failed: "
                          "connection reset (injected on rank 1)",
                          r));
}

TEST(InProcessCommunicator, CountsAndChecksLikeTheOtherCommunicators) {
  InProcessJob job(2);
  std::vector<CommCounters> counters(2);
  std::vector<uint64_t> sequence(2);
  expect_no_errors(job.run([&](Communicator& comm) {
    std::vector<float> data(100);
    comm.all_reduce(data.data(), 100, ReduceOp::sum, "a").wait();
    comm.reduce_scatter(data.data(), data.data() + 10 * comm.rank(), 10, ReduceOp::sum, "b").wait();
    comm.all_gather(data.data() + 20 * comm.rank(), data.data(), 20, "c").wait();
    EXPECT_THROW(comm.reduce_scatter(data.data(), data.data() + 1, 4, ReduceOp::sum, "x"), Error);
    EXPECT_THROW(comm.broadcast(data.data(), 4, 2, "x"), Error);
    sequence[static_cast<size_t>(comm.rank())] = comm.next_sequence();
    counters[static_cast<size_t>(comm.rank())] = comm.take_counters();
  }));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sequence[static_cast<size_t>(r)], 3u);
    const CommCounters& c = counters[static_cast<size_t>(r)];
    EXPECT_EQ(c[CollectiveKind::all_reduce].bytes, 400u);
    EXPECT_EQ(c[CollectiveKind::all_reduce].bus_bytes, 400u);  // 2 (N-1)/N
    EXPECT_EQ(c[CollectiveKind::reduce_scatter].bytes, 80u);
    EXPECT_EQ(c[CollectiveKind::all_gather].bus_bytes, 80u);
  }
  // A collective never waited for is a leak, reported when the rank finalizes.
  InProcessJob leaky(2);
  const auto errors = leaky.run([&](Communicator& comm) {
    std::vector<float> x(4);
    Work forgotten = comm.all_reduce(x.data(), 4, ReduceOp::sum, "forgotten");
    (void)forgotten;
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[static_cast<size_t>(r)],
              fmt::format("rank {}: 1 collective(s) on world were never waited for: all_reduce "
                          "'forgotten' (#0 on world)",
                          r));
}

}  // namespace
}  // namespace shardlm
