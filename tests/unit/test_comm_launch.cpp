// The mpirun command line built for a given machine, and the probes behind it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "shardlm/comm/counters.hpp"
#include "shardlm/comm/launch.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {
namespace {

using Args = std::vector<std::string>;

TEST(MpirunCommand, AddsOnlyTheFlagsThisMachineNeeds) {
  LaunchEnvironment plain{.physical_cores = 8, .running_as_root = false, .single_copy_works = true};
  EXPECT_EQ(mpirun_command(4, {"/bin/shardlm", "train", "--steps", "10"}, plain),
            (Args{"mpirun", "-n", "4", "/bin/shardlm", "train", "--steps", "10"}));

  LaunchEnvironment container{
      .physical_cores = 2, .running_as_root = true, .single_copy_works = false};
  EXPECT_EQ(mpirun_command(2, {"prog"}, container),
            (Args{"mpirun", "-n", "2", "--allow-run-as-root", "--mca",
                  "btl_vader_single_copy_mechanism", "none", "prog"}));
  EXPECT_EQ(mpirun_command(4, {"prog"}, container),
            (Args{"mpirun", "-n", "4", "--oversubscribe", "--allow-run-as-root", "--mca",
                  "btl_vader_single_copy_mechanism", "none", "prog"}));
  EXPECT_THROW(mpirun_command(0, {"prog"}, plain), Error);
}

TEST(MpirunCommand, ProbesThisMachine) {
  const LaunchEnvironment env = probe_launch_environment();
  EXPECT_GE(env.physical_cores, 1);
  const Args command = mpirun_command(1, {"prog"});
  ASSERT_GE(command.size(), 4u);
  EXPECT_EQ(command.front(), "mpirun");
  EXPECT_EQ(command.back(), "prog");
}

TEST(CommCounters, BusBytesFollowTheNcclConventions) {
  EXPECT_EQ(bus_bytes_for(CollectiveKind::all_reduce, 1000, 4), 1500u);     // 2 (N-1)/N
  EXPECT_EQ(bus_bytes_for(CollectiveKind::reduce_scatter, 1000, 4), 750u);  // (N-1)/N
  EXPECT_EQ(bus_bytes_for(CollectiveKind::all_gather, 1000, 2), 500u);
  EXPECT_EQ(bus_bytes_for(CollectiveKind::broadcast, 1000, 2), 1000u);
  EXPECT_EQ(bus_bytes_for(CollectiveKind::barrier, 1000, 2), 0u);
  EXPECT_EQ(bus_bytes_for(CollectiveKind::all_reduce, 1000, 1), 0u);
  EXPECT_EQ(bus_bytes_for(CollectiveKind::all_reduce, uint64_t{1} << 62, 3),
            (uint64_t{1} << 62) / 3 * 4 + 1);  // floor(2 * 2^62 * 2 / 3), no overflow
  EXPECT_EQ(bus_bytes_for(CollectiveKind::all_to_all, 1000, 4), 750u);  // nccl-tests alltoall
  EXPECT_EQ(bus_bytes_for(CollectiveKind::send, 1000, 4), 1000u);
  EXPECT_EQ(bus_bytes_for(CollectiveKind::send_recv, 1000, 2), 1000u);
  EXPECT_EQ(bus_bytes_for(CollectiveKind::recv, 1000, 2), 0u);  // the sender counts it
  EXPECT_EQ(bus_bytes_for(CollectiveKind::send_recv, 1000, 1), 0u);  // to itself
  EXPECT_EQ(to_string(CollectiveKind::all_to_all_v), "all_to_all_v");
  EXPECT_EQ(to_string(CollectiveKind::send_recv), "send_recv");
}

TEST(CommCounters, AddAndJson) {
  CounterBlock block;
  block.add_call(CollectiveKind::all_gather, 64, 32);
  block.add_seconds(CollectiveKind::all_gather, 0.5);
  block.add_exposed_seconds(0.25);
  CommCounters sum = block.snapshot();
  sum += block.take();
  EXPECT_EQ(sum[CollectiveKind::all_gather].calls, 2u);
  EXPECT_EQ(sum[CollectiveKind::all_gather].bus_bytes, 64u);
  EXPECT_EQ(sum.exposed_seconds, 0.5);
  EXPECT_EQ(block.snapshot().total().calls, 0u);
  const auto json = sum.to_json();
  EXPECT_EQ(json["all_gather"]["bytes"], 128);
  EXPECT_EQ(json["total"]["seconds"], 1.0);
  EXPECT_EQ(json["exposed_seconds"], 0.5);
  block.add_call(CollectiveKind::send_recv, 40, 40, 1);
  block.add_call(CollectiveKind::all_to_all, 90, 60, 2);
  const auto more = block.snapshot().to_json();
  EXPECT_EQ(more["send_recv"]["messages"], 1);
  EXPECT_EQ(more["all_to_all"]["bus_bytes"], 60);
  EXPECT_EQ(more["total"]["messages"], 3);
}

}  // namespace
}  // namespace shardlm
