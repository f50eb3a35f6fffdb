// all_to_all, all_to_all_v, send, recv and send_recv on the in-process communicator
// (N ranks on N threads) and through the emulated device's communicator, against
// expectations written from the definitions: block p of rank q's receive buffer is what
// rank p addressed to q, element by element (values encode sender, receiver and
// index, so a block delivered to the wrong place or offset cannot pass). Also the
// failure paths: counts or messages that disagree fail both sides with one line, a
// rank that never arrives runs into the deadline naming the operation and its peer,
// and bad arguments are refused before anything is sent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/emulated_device_communicator.hpp"
#include "shardlm/comm/in_process_communicator.hpp"

namespace shardlm {
namespace {

// What `sender` puts at element i of its block for `receiver` (exact in fp32).
float message_value(int sender, int receiver, size_t i) {
  return static_cast<float>(sender * 100000 + receiver * 1000 + static_cast<int>(i));
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Elements rank p sends rank q in the uneven tests: zeros included, no two alike.
size_t uneven_count(int p, int q) { return static_cast<size_t>((p * 3 + q * 5 + 1) % 4) * (p + 1); }

// Rank `me`'s send buffer for per-peer counts count(me, q), blocks in rank order.
std::vector<float> pack_for_peers(int me, int n, const std::function<size_t(int, int)>& count) {
  std::vector<float> out;
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count(me, q); ++i) out.push_back(message_value(me, q, i));
  return out;
}

TEST(CommExchange, AllToAllDeliversBlockPFromRankPOnOneToFourRanks) {
  for (int n = 1; n <= 4; ++n)
    for (size_t per_peer : {size_t{0}, size_t{1}, size_t{7}}) {
      InProcessJob job(n);
      expect_no_errors(job.run([&](Communicator& comm) {
        const int me = comm.rank();
        std::vector<float> send =
            pack_for_peers(me, n, [&](int, int) { return per_peer; });
        std::vector<float> recv(per_peer * n, -1.0f);
        comm.all_to_all(send.data(), recv.data(), per_peer, "ulysses q").wait();
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < per_peer; ++i)
            if (recv[p * per_peer + i] != message_value(p, me, i))
              throw Error(fmt::format("n {} per_peer {}: rank {} block {} element {} is {}", n,
                                      per_peer, me, p, i, recv[p * per_peer + i]));
      }));
    }
}

TEST(CommExchange, AllToAllMovesBf16ElementsAsTheyAre) {
  InProcessJob job(3);
  expect_no_errors(job.run([&](Communicator& comm) {
    const int me = comm.rank();
    const size_t per_peer = 5;
    std::vector<uint16_t> send(per_peer * 3), recv(per_peer * 3, 0);
    for (int q = 0; q < 3; ++q)
      for (size_t i = 0; i < per_peer; ++i) send[q * per_peer + i] = static_cast<uint16_t>(0x3f00 + me * 64 + q * 8 + i);
    comm.all_to_all(ConstTypedPtr(send.data(), DType::bf16), TypedPtr(recv.data(), DType::bf16),
                    per_peer, "expert dispatch")
        .wait();
    for (int p = 0; p < 3; ++p)
      for (size_t i = 0; i < per_peer; ++i)
        if (recv[p * per_peer + i] != 0x3f00 + p * 64 + me * 8 + i) throw Error("bf16 block wrong");
    const CommCounters c = comm.counters();
    if (c[CollectiveKind::all_to_all].bytes != per_peer * 3 * 2) throw Error("bf16 bytes wrong");
  }));
}

TEST(CommExchange, AllToAllVWithUnevenAndZeroCountsOnOneToFourRanks) {
  for (int n = 1; n <= 4; ++n) {
    InProcessJob job(n);
    expect_no_errors(job.run([&](Communicator& comm) {
      const int me = comm.rank();
      std::vector<size_t> send_counts(n), recv_counts(n);
      for (int q = 0; q < n; ++q) {
        send_counts[q] = uneven_count(me, q);
        recv_counts[q] = uneven_count(q, me);
      }
      std::vector<float> send = pack_for_peers(me, n, uneven_count);
      const size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
      std::vector<float> recv(total + 1, -1.0f);  // one guard element past the end
      comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, "moe dispatch").wait();
      size_t at = 0;
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < recv_counts[p]; ++i, ++at)
          if (recv[at] != message_value(p, me, i))
            throw Error(fmt::format("n {}: rank {} element {} (from rank {}) is {}", n, me, at, p,
                                    recv[at]));
      if (recv[total] != -1.0f) throw Error("wrote past the receive buffer");
    }));
  }
}

TEST(CommExchange, AllToAllVCountsThatDisagreeFailEveryRankWithOneLine) {
  InProcessJob job(2);
  const auto errors = job.run([&](Communicator& comm) {
    std::vector<float> send(8), recv(8);
    // Rank 0 sends 2 elements to rank 1, which expects 3.
    std::vector<size_t> send_counts = {1, 2}, recv_counts = {1, 1};
    if (comm.rank() == 1) send_counts = {1, 1}, recv_counts = {3, 1};
    comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, "moe combine").wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[r], fmt::format("rank {}: all_to_all_v 'moe combine' (#0 on world) failed: "
                                     "counts disagree: rank 0 sends 2 elements to rank 1 but "
                                     "rank 1 expects 3 from rank 0",
                                     r));
}

TEST(CommExchange, RingOfSendRecvPassesEveryBlockAroundOnOneToFourRanks) {
  for (int n = 1; n <= 4; ++n) {
    InProcessJob job(n);
    expect_no_errors(job.run([&](Communicator& comm) {
      const int me = comm.rank();
      const int next = (me + 1) % n;
      const int prev = (me - 1 + n) % n;
      // Block of origin k has k + 2 elements (uneven sizes travel round the ring).
      const auto block_size = [](int k) { return static_cast<size_t>(k + 2); };
      std::vector<float> held(block_size(me));
      for (size_t i = 0; i < held.size(); ++i) held[i] = message_value(me, me, i);
      for (int step = 1; step < n; ++step) {
        const int arriving = (me - step + n) % n;  // origin of the block received now
        std::vector<float> incoming(block_size(arriving), -1.0f);
        comm.send_recv(held.data(), held.size(), next, incoming.data(), incoming.size(), prev,
                       fmt::format("ring kv step {}", step))
            .wait();
        for (size_t i = 0; i < incoming.size(); ++i)
          if (incoming[i] != message_value(arriving, arriving, i))
            throw Error(fmt::format("n {} step {}: rank {} got a wrong block", n, step, me));
        held = std::move(incoming);
      }
      // A ring of one: send_recv to itself is a copy.
      if (n == 1) {
        std::vector<float> back(held.size());
        comm.send_recv(held.data(), held.size(), 0, back.data(), back.size(), 0, "self").wait();
        if (back != held) throw Error("send_recv to itself did not copy");
      }
    }));
  }
}

TEST(CommExchange, SendsAndReceivesMatchPerPairAndLeaveCollectiveNumbersAlone) {
  InProcessJob job(3);
  std::vector<uint64_t> collective_numbers(3);
  expect_no_errors(job.run([&](Communicator& comm) {
    const int me = comm.rank();
    // A pipeline: 0 -> 1 -> 2, two micro-batches, a barrier in between on every rank.
    std::vector<float> a(4), b(4);
    for (int micro = 0; micro < 2; ++micro) {
      const std::string label = fmt::format("activations micro {}", micro);
      if (me > 0) {
        comm.recv(a.data(), a.size(), me - 1, label).wait();
        for (size_t i = 0; i < a.size(); ++i)
          if (a[i] != message_value(me - 1, micro, i)) throw Error("wrong activations");
      }
      if (me < 2) {
        for (size_t i = 0; i < b.size(); ++i) b[i] = message_value(me, micro, i);
        comm.send(b.data(), b.size(), me + 1, label).wait();
      }
      comm.barrier("micro-batch done").wait();
    }
    collective_numbers[me] = comm.next_sequence();
    const CommCounters c = comm.counters();
    if (c[CollectiveKind::send].calls != (me < 2 ? 2u : 0u) ||
        c[CollectiveKind::recv].calls != (me > 0 ? 2u : 0u))
      throw Error("point-to-point calls miscounted");
  }));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(collective_numbers[r], 2u) << r;  // the two barriers
}

TEST(CommExchange, MessagesThatDisagreeFailBothSidesWithOneLine) {
  InProcessJob job(2);
  const auto errors = job.run([&](Communicator& comm) {
    std::vector<float> x(6);
    if (comm.rank() == 0)
      comm.send(x.data(), 4, 1, "kv block").wait();
    else
      comm.recv(x.data(), 6, 0, "kv block").wait();
  });
  const std::string why =
      "point-to-point out of step on world: rank 0 sent 'kv block' (#0 to rank 1, 16 bytes, fp32) "
      "but rank 1 expects 'kv block' (#0 from rank 0, 24 bytes, fp32)";
  EXPECT_EQ(errors[0], "rank 0: send 'kv block' (#0 to rank 1 on world) failed: " + why);
  EXPECT_EQ(errors[1], "rank 1: recv 'kv block' (#0 from rank 0 on world) failed: " + why);
}

TEST(CommExchange, ARankThatNeverArrivesRunsIntoTheDeadlineNamingOpAndPeer) {
  InProcessJob job(3, CommOptions{.timeout_seconds = 0.2});
  const auto errors = job.run([&](Communicator& comm) {
    std::vector<float> x(6), y(6);
    if (comm.rank() == 0) comm.send(x.data(), 6, 2, "activations stage 0").wait();
    if (comm.rank() == 1)
      comm.send_recv(x.data(), 6, 2, y.data(), 6, 0, "ring kv step 1").wait();
    // rank 2 is busy elsewhere and never receives.
  });
  EXPECT_EQ(errors[0],
            "rank 0: timed out after 0.2 s waiting for send 'activations stage 0' (#0 to rank 2 "
            "on world)");
  EXPECT_EQ(errors[1],
            "rank 1: timed out after 0.2 s waiting for send_recv 'ring kv step 1' (#0 to rank 2, "
            "#0 from rank 0 on world)");
  EXPECT_EQ(errors[2], "");

  InProcessJob lossy(2, CommOptions{.timeout_seconds = 0.2});
  lossy.inject({.rank = 1, .label = "ulysses k"});
  const auto both = lossy.run([&](Communicator& comm) {
    std::vector<float> x(4), y(4);
    comm.all_to_all(x.data(), y.data(), 2, "ulysses k").wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(both[r], fmt::format("rank {}: timed out after 0.2 s waiting for all_to_all "
                                   "'ulysses k' (#0 on world)",
                                   r));
}

TEST(CommExchange, AbortEndsRanksWaitingInPointToPoint) {
  InProcessJob job(2, CommOptions{.timeout_seconds = 600});
  const auto errors = job.run([&](Communicator& comm) {
    std::vector<float> x(4);
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comm.abort_job("error: stage 1 ran out of memory");
    }
    comm.recv(x.data(), 4, 1, "activations").wait();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "rank 1: error: stage 1 ran out of memory");
}

TEST(CommExchange, CountsBytesAndMessagesPerKind) {
  InProcessJob job(3);
  std::vector<CommCounters> counters(3);
  expect_no_errors(job.run([&](Communicator& comm) {
    const int me = comm.rank();
    std::vector<float> a(30), b(30);
    comm.all_to_all(a.data(), b.data(), 4, "a2a").wait();  // 3 blocks of 4 floats
    // Every rank sends q + 1 elements to rank q, so rank q receives q + 1 from each.
    const std::vector<size_t> send_counts = {1, 2, 3}, recv_counts(3, size_t(me + 1));
    comm.all_to_all_v(a.data(), send_counts, b.data(), recv_counts, "a2av").wait();
    comm.send_recv(a.data(), 5, (me + 1) % 3, b.data(), 5, (me + 2) % 3, "ring").wait();
    counters[me] = comm.take_counters();
  }));
  for (int r = 0; r < 3; ++r) {
    const CommCounters& c = counters[r];
    EXPECT_EQ(c[CollectiveKind::all_to_all].bytes, 48u);
    EXPECT_EQ(c[CollectiveKind::all_to_all].bus_bytes, 32u);  // (N-1)/N
    EXPECT_EQ(c[CollectiveKind::all_to_all].messages, 2u);
    EXPECT_EQ(c[CollectiveKind::all_to_all_v].bytes, 24u);  // 1 + 2 + 3 floats
    EXPECT_EQ(c[CollectiveKind::all_to_all_v].bus_bytes, 24u - 4u * (r + 1));  // not its own
    EXPECT_EQ(c[CollectiveKind::all_to_all_v].messages, 2u);
    EXPECT_EQ(c[CollectiveKind::send_recv].bytes, 20u);
    EXPECT_EQ(c[CollectiveKind::send_recv].bus_bytes, 20u);
    EXPECT_EQ(c[CollectiveKind::send_recv].messages, 1u);
    EXPECT_EQ(c.total().calls, 3u);
  }
}

TEST(CommExchange, BadArgumentsAreRefusedBeforeAnythingIsSent) {
  InProcessJob job(2);
  expect_no_errors(job.run([&](Communicator& comm) {
    std::vector<float> a(8), b(8);
    std::vector<uint16_t> h(8);
    const auto refuses = [](const std::function<void()>& call, const std::string& want) {
      try {
        call();
      } catch (const Error& e) {
        if (std::string(e.what()) == want) return;
        throw Error(fmt::format("got '{}', expected '{}'", e.what(), want));
      }
      throw Error("accepted: " + want);
    };
    const std::vector<size_t> two = {1, 1}, three = {1, 1, 1};
    refuses([&] { comm.all_to_all_v(a.data(), three, b.data(), two, "x"); },
            "all_to_all_v 'x': expected 2 send and 2 recv counts (one per rank of world), got 3 "
            "and 2");
    const std::vector<size_t> mine_two = comm.rank() == 0 ? std::vector<size_t>{2, 1}
                                                           : std::vector<size_t>{1, 2};
    refuses([&] { comm.all_to_all_v(a.data(), mine_two, b.data(), two, "x"); },
            fmt::format("all_to_all_v 'x': rank {} sends 2 elements to itself but expects 1 "
                        "from itself",
                        comm.rank()));
    refuses([&] { comm.all_to_all(a.data(), TypedPtr(h.data(), DType::bf16), 2, "x"); },
            "all_to_all 'x': send is fp32 but recv is bf16 (expected one dtype)");
    refuses([&] { comm.all_to_all(a.data(), a.data() + 2, 2, "x"); },
            "all_to_all 'x': send and recv must not overlap (no in-place all-to-all)");
    refuses([&] { comm.send(a.data(), 2, 2, "x"); },
            "send 'x': peer to send to 2 is not a rank of world (size 2)");
    refuses([&] { comm.recv(a.data(), 2, -1, "x"); },
            "recv 'x': peer to receive from -1 is not a rank of world (size 2)");
    refuses([&] { comm.send(a.data(), 2, comm.rank(), "x"); },
            fmt::format("send 'x': peer {0} is this rank (a message to itself: use send_recv "
                        "with to == from == {0}, or a copy)",
                        comm.rank()));
    refuses([&] { comm.send_recv(a.data(), 2, comm.rank(), b.data(), 2, 1 - comm.rank(), "x"); },
            fmt::format("send_recv 'x': sends to rank {0} and receives from rank {1}: either both "
                        "are this rank ({0}, a ring of one) or neither",
                        comm.rank(), 1 - comm.rank()));
    refuses([&] { comm.send_recv(a.data(), 4, 1 - comm.rank(), a.data() + 2, 4, 1 - comm.rank(), "x"); },
            "send_recv 'x': send and recv must not overlap");
    refuses([&] { comm.send(static_cast<const float*>(nullptr), 2, 1 - comm.rank(), "x"); }, "send 'x': null buffer");
    // Nothing was numbered or counted by the refused calls.
    if (comm.counters().total().calls != 0 || comm.next_sequence() != 0)
      throw Error("a refused call was counted");
  }));
}

// The emulated device's communicator: device pointers untagged and carried by the host
// communicator, with the same results, labels and counters.
TEST(CommExchange, EmulatedDeviceBuffersTravelThroughTheHostCommunicator) {
  Backend& device = backend_for({DeviceKind::emulated, 0});
  const int n = 3;
  InProcessJob job(n);
  std::vector<CommCounters> host_counters(n), device_counters(n);
  expect_no_errors(job.run([&](Communicator& world) {
    EmulatedDeviceCommunicator comm(world);
    const int me = comm.rank();
    std::vector<std::pair<void*, size_t>> allocated;
    const auto on_device = [&](const std::vector<float>& host) {
      const size_t bytes = std::max<size_t>(host.size(), 1) * 4;
      void* d = device.allocator().allocate(bytes, "test buffer");
      allocated.emplace_back(d, bytes);
      if (!host.empty()) device.copy_from_host(d, host.data(), host.size() * 4);
      return static_cast<float*>(d);
    };
    const auto to_host = [&](const float* d, size_t count) {
      std::vector<float> out(count);
      if (count) device.copy_to_host(out.data(), d, count * 4);
      return out;
    };
    std::vector<size_t> send_counts(n), recv_counts(n);
    for (int q = 0; q < n; ++q) {
      send_counts[q] = uneven_count(me, q);
      recv_counts[q] = uneven_count(q, me);
    }
    const std::vector<float> send_host = pack_for_peers(me, n, uneven_count);
    const size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
    float* send = on_device(send_host);
    float* recv = on_device(std::vector<float>(total, -1.0f));
    comm.all_to_all_v(send, send_counts, recv, recv_counts, "moe dispatch").wait();
    const std::vector<float> got = to_host(recv, total);
    size_t at = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < recv_counts[p]; ++i, ++at)
        if (got[at] != message_value(p, me, i)) throw Error("device all_to_all_v wrong");
    float* ring_in = on_device(std::vector<float>(3, -1.0f));
    comm.send_recv(send, 3, (me + 1) % n, ring_in, 3, (me + n - 1) % n, "ring").wait();
    const std::vector<float> ring = to_host(ring_in, 3);
    const int prev = (me + n - 1) % n;
    for (size_t i = 0; i < 3; ++i)
      if (ring[i] != pack_for_peers(prev, n, uneven_count)[i]) throw Error("device ring wrong");
    // Host memory handed to the device communicator passes through as it is.
    std::vector<float> host_in(4 * n), host_out(4 * n);
    comm.all_to_all(host_in.data(), host_out.data(), 4, "host a2a").wait();
    device_counters[me] = comm.take_counters();
    host_counters[me] = world.take_counters();
    for (const auto& [d, bytes] : allocated) device.allocator().deallocate(d, bytes);
  }));
  for (int r = 0; r < n; ++r)
    for (auto kind : {CollectiveKind::all_to_all, CollectiveKind::all_to_all_v,
                      CollectiveKind::send_recv}) {
      EXPECT_EQ(device_counters[r][kind].calls, 1u) << to_string(kind);
      EXPECT_EQ(device_counters[r][kind].bytes, host_counters[r][kind].bytes) << to_string(kind);
    }
}

}  // namespace
}  // namespace shardlm
