// The world-size-1 communicator: identities, argument checks, counters, leak check,
// abort, and the factory's choice of backend.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/comm/world.hpp"

namespace shardlm {
namespace {

TEST(SingleProcessCommunicator, CollectivesAreIdentities) {
  SingleProcessCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  std::vector<float> data = {1.5f, -2.0f, 3.25f};
  comm.all_reduce(data.data(), data.size(), ReduceOp::sum, "ar").wait();
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.25f}));

  std::vector<float> recv(3, 0.0f);
  comm.reduce_scatter(data.data(), recv.data(), 3, ReduceOp::sum, "rs").wait();
  EXPECT_EQ(recv, data);
  comm.reduce_scatter(data.data(), data.data(), 3, ReduceOp::sum, "rs in place").wait();

  std::vector<float> gathered(3, 0.0f);
  comm.all_gather(data.data(), gathered.data(), 3, "ag").wait();
  EXPECT_EQ(gathered, data);
  comm.all_gather(gathered.data(), gathered.data(), 3, "ag in place").wait();
  EXPECT_EQ(gathered, data);

  char bytes[4] = {'a', 'b', 'c', 'd'};
  comm.broadcast(bytes, 4, 0, "bc").wait();
  EXPECT_EQ(std::string(bytes, 4), "abcd");
  Work barrier = comm.barrier("b");
  EXPECT_TRUE(barrier.is_done());
  comm.finalize();
}

TEST(SingleProcessCommunicator, BlockingHelpersKeepValues) {
  SingleProcessCommunicator comm;
  std::vector<double> loss = {2.5, 0.125};
  comm.all_reduce_blocking(loss, ReduceOp::sum, "loss sum");
  EXPECT_EQ(loss, (std::vector<double>{2.5, 0.125}));
  std::vector<int64_t> tokens = {4096};
  comm.all_reduce_blocking(tokens, ReduceOp::max, "tokens");
  EXPECT_EQ(tokens[0], 4096);
  EXPECT_EQ(comm.all_gather_u64(0xabcdef, "digest"), (std::vector<uint64_t>{0xabcdef}));
  std::string config = R"({"n_layer": 2})";
  comm.broadcast_string(config, 0, "config");
  EXPECT_EQ(config, R"({"n_layer": 2})");
}

TEST(SingleProcessCommunicator, RejectsBadArguments) {
  SingleProcessCommunicator comm;
  std::vector<float> buffer(8);
  // Partially overlapping buffers are neither in place nor separate.
  EXPECT_THROW(comm.reduce_scatter(buffer.data(), buffer.data() + 1, 4, ReduceOp::sum, "x"), Error);
  EXPECT_THROW(comm.all_gather(buffer.data() + 1, buffer.data(), 4, "x"), Error);
  EXPECT_THROW(comm.broadcast(buffer.data(), 4, 1, "x"), Error);
  EXPECT_THROW(comm.broadcast(buffer.data(), 4, -1, "x"), Error);
  EXPECT_THROW(comm.all_reduce(nullptr, 3, ReduceOp::sum, "x"), Error);
  comm.all_reduce(nullptr, 0, ReduceOp::sum, "empty").wait();
  EXPECT_THROW(SingleProcessCommunicator(CommOptions{.timeout_seconds = 0}), Error);
}

TEST(SingleProcessCommunicator, CountsCallsBytesAndSequence) {
  SingleProcessCommunicator comm;
  std::vector<float> data(100);
  EXPECT_EQ(comm.next_sequence(), 0u);
  comm.all_reduce(data.data(), 100, ReduceOp::sum, "a").wait();
  comm.all_reduce(data.data(), 50, ReduceOp::sum, "b").wait();
  comm.reduce_scatter(data.data(), data.data(), 10, ReduceOp::sum, "c").wait();
  comm.all_gather(data.data(), data.data(), 20, "d").wait();
  comm.broadcast(data.data(), 7, 0, "e").wait();
  comm.barrier("f").wait();
  EXPECT_EQ(comm.next_sequence(), 6u);

  const CommCounters c = comm.take_counters();
  EXPECT_EQ(c[CollectiveKind::all_reduce].calls, 2u);
  EXPECT_EQ(c[CollectiveKind::all_reduce].bytes, 600u);
  EXPECT_EQ(c[CollectiveKind::reduce_scatter].bytes, 40u);  // size * recv_count * 4
  EXPECT_EQ(c[CollectiveKind::all_gather].bytes, 80u);      // size * send_count * 4
  EXPECT_EQ(c[CollectiveKind::broadcast].bytes, 7u);
  EXPECT_EQ(c[CollectiveKind::barrier].calls, 1u);
  EXPECT_EQ(c.total().calls, 6u);
  EXPECT_EQ(c.total().bytes, 727u);
  EXPECT_EQ(c.total().bus_bytes, 0u);  // nothing leaves a single process
  // take_counters() reset them.
  EXPECT_EQ(comm.counters().total().calls, 0u);
  EXPECT_EQ(comm.counters().exposed_seconds, 0.0);
}

TEST(SingleProcessCommunicator, FinalizeReportsCollectivesNeverWaitedFor) {
  SingleProcessCommunicator comm;
  std::vector<float> data(4);
  comm.all_reduce(data.data(), 4, ReduceOp::sum, "waited").wait();
  Work seen = comm.barrier("seen done");
  EXPECT_TRUE(seen.is_done());
  comm.all_reduce(data.data(), 4, ReduceOp::sum, "gradients bucket 2");  // dropped
  try {
    comm.finalize();
    FAIL() << "finalize() should report the dropped collective";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "rank 0: 1 collective(s) on world were never waited for: "
                 "all_reduce 'gradients bucket 2' (#2 on world)");
  }
  EXPECT_THROW(comm.barrier("after finalize"), Error);
  comm.finalize();  // idempotent, nothing left to report
}

TEST(SingleProcessCommunicator, SplitGivesANamedSingleRankCommunicator) {
  SingleProcessCommunicator comm;
  auto shard = comm.split(0, 0, "shard group");
  EXPECT_EQ(shard->size(), 1);
  EXPECT_EQ(shard->name(), "shard group");
  std::vector<float> data = {1, 2};
  shard->all_reduce(data.data(), 2, ReduceOp::sum, "x").wait();
  EXPECT_EQ(shard->counters().total().calls, 1u);
  EXPECT_EQ(comm.counters().total().calls, 0u);  // counters are per communicator
  EXPECT_THROW(comm.split(-1, 0, "bad"), Error);
}

TEST(SingleProcessCommunicator, ASubGroupCountedWithItsParentAddsToTheParentsCounters) {
  // As hybrid attention's Ulysses and ring groups count into the context group's.
  SingleProcessCommunicator comm;
  auto sub = comm.split(0, 0, "world.ring");
  comm.count_with_parent(*sub);
  std::vector<float> data = {1, 2};
  sub->all_reduce(data.data(), 2, ReduceOp::sum, "x").wait();
  comm.all_reduce(data.data(), 2, ReduceOp::sum, "y").wait();
  EXPECT_EQ(sub->counters().total().calls, 1u);  // the child's own still read only its own
  EXPECT_EQ(comm.counters().total().calls, 2u);
  EXPECT_EQ(comm.take_counters().total().calls, 2u);  // taking resets both
  EXPECT_EQ(comm.counters().total().calls, 0u);
  EXPECT_EQ(sub->counters().total().calls, 0u);
  EXPECT_THROW(comm.count_with_parent(comm), Error);
}

TEST(SingleProcessCommunicatorDeathTest, AbortJobPrintsRankAndExitsNonZero) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SingleProcessCommunicator comm;
  EXPECT_EXIT(comm.abort_job("loss became NaN at step 3"), testing::ExitedWithCode(1),
              "rank 0: loss became NaN at step 3");
}

TEST(MakeWorldCommunicator, IsSingleProcessWithoutAnMpiLauncher) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) unsetenv(name);
  EXPECT_FALSE(launched_by_mpi_launcher());
  auto world = make_world_communicator(CommOptions{.timeout_seconds = 5});
  EXPECT_EQ(world->size(), 1);
  EXPECT_NE(dynamic_cast<SingleProcessCommunicator*>(world.get()), nullptr);
  EXPECT_EQ(world->options().timeout_seconds, 5.0);

  setenv("SHARDLM_COMM_CHECK", "1", 1);
  EXPECT_TRUE(make_world_communicator()->options().check_sequence);
  unsetenv("SHARDLM_COMM_CHECK");
  EXPECT_FALSE(make_world_communicator()->options().check_sequence);
  setenv("SHARDLM_COMM_OVERLAP", "0", 1);
  EXPECT_FALSE(make_world_communicator()->options().overlap);
  setenv("SHARDLM_COMM_OVERLAP", "1", 1);
  EXPECT_TRUE(make_world_communicator(CommOptions{.overlap = false})->options().overlap);
  unsetenv("SHARDLM_COMM_OVERLAP");
  EXPECT_TRUE(make_world_communicator()->options().overlap);

  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_TRUE(launched_by_mpi_launcher());
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("PMI_SIZE", "2", 1);
  EXPECT_TRUE(launched_by_mpi_launcher());
  unsetenv("PMI_SIZE");
}

}  // namespace
}  // namespace shardlm
