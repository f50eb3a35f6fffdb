// The device mesh: the layout arithmetic (coordinates, groups, data-parallel ranks)
// against a naive enumeration of row-major coordinates, the --mesh spelling and its
// errors, the meshes the strategies run on, and DeviceMesh's groups on the in-process
// communicator (which ranks a group holds, what a collective over it sums, which
// groups are split and which are the world), and the warning for a tensor group that
// spans hosts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/parallel/host_placement.hpp"
#include "shardlm/parallel/mesh.hpp"
#include "shardlm/parallel/placed_mesh.hpp"
#include "shardlm/parallel/strategy_options.hpp"

namespace shardlm {
namespace {

const MeshDim kDims[] = {MeshDim::replicate, MeshDim::shard,  MeshDim::expert,
                         MeshDim::context,   MeshDim::tensor, MeshDim::pipeline};

// A strategy's options with P context ranks and E expert ranks.
StrategyOptions experts_over_context(StrategyKind kind, int context_parallel, int expert_parallel) {
  StrategyOptions o;
  o.kind = kind;
  o.context_parallel = context_parallel;
  o.expert_parallel = expert_parallel;
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every (coordinates -> rank) pair of `shape`, enumerated by nested counting with the
// last dimension fastest: the reference for MeshShape's arithmetic.
std::vector<std::vector<int>> enumerate_coordinates(const MeshShape& shape) {
  std::vector<std::vector<int>> all;
  std::vector<int> c(kMeshDims, 0);
  for (;;) {
    all.push_back(c);
    int d = kMeshDims - 1;
    while (d >= 0 && ++c[static_cast<size_t>(d)] == shape.size(kDims[d])) c[static_cast<size_t>(d--)] = 0;
    if (d < 0) return all;
  }
}

MeshShape shape_of(std::initializer_list<std::pair<MeshDim, int>> sizes) {
  MeshShape s;
  for (auto [d, n] : sizes) s.set_size(d, n);
  return s;
}

TEST(MeshShape, CoordinatesAreRowMajorOutermostFirst) {
  for (const MeshShape& shape :
       {MeshShape(), shape_of({{MeshDim::replicate, 2}, {MeshDim::shard, 4}}),
        shape_of({{MeshDim::shard, 3}, {MeshDim::context, 2}}),
        shape_of({{MeshDim::replicate, 2}, {MeshDim::shard, 3}, {MeshDim::tensor, 2},
                  {MeshDim::pipeline, 2}})}) {
    const auto all = enumerate_coordinates(shape);
    ASSERT_EQ(static_cast<int>(all.size()), shape.world_size()) << shape.to_string();
    for (int r = 0; r < shape.world_size(); ++r) {
      EXPECT_EQ(shape.coordinates(r), all[static_cast<size_t>(r)]) << shape.to_string() << " rank " << r;
      EXPECT_EQ(shape.rank_of(all[static_cast<size_t>(r)]), r);
    }
  }
}

TEST(MeshShape, HybridGroupsAreConsecutiveShardsAndStridedReplicas) {
  const MeshShape hybrid = shape_of({{MeshDim::replicate, 2}, {MeshDim::shard, 4}});
  EXPECT_EQ(hybrid.group_ranks(5, {MeshDim::shard}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(hybrid.group_ranks(5, {MeshDim::replicate}), (std::vector<int>{1, 5}));
  EXPECT_EQ(hybrid.group_ranks(5, MeshShape::data_parallel()),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(hybrid.coordinate(5, MeshDim::replicate), 1);
  EXPECT_EQ(hybrid.coordinate(5, MeshDim::shard), 1);
  // What the strategy's split used to be: color rank / G, and rank % G for replicas.
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(hybrid.group_index(r, {MeshDim::shard}), r / 4);
    EXPECT_EQ(hybrid.rank_in_group(r, {MeshDim::shard}), r % 4);
    EXPECT_EQ(hybrid.group_index(r, {MeshDim::replicate}), r % 4);
    EXPECT_EQ(hybrid.rank_in_group(r, {MeshDim::replicate}), r / 4);
  }
}

TEST(MeshShape, GroupRankAndIndexAgreeWithTheGroupsMembers) {
  const MeshShape shape = shape_of({{MeshDim::replicate, 2}, {MeshDim::shard, 3},
                                    {MeshDim::context, 2}, {MeshDim::tensor, 2}});
  for (const MeshDims& dims :
       {MeshDims{MeshDim::shard}, MeshDims{MeshDim::replicate}, MeshShape::data_parallel(),
        MeshDims{MeshDim::shard, MeshDim::context}, MeshDims{MeshDim::tensor},
        MeshDims{MeshDim::replicate, MeshDim::context, MeshDim::tensor}}) {
    std::vector<int> members_of_group(static_cast<size_t>(shape.world_size()), 0);
    for (int r = 0; r < shape.world_size(); ++r) {
      const auto ranks = shape.group_ranks(r, dims);
      ASSERT_EQ(static_cast<int>(ranks.size()), shape.size(dims)) << dims.to_string();
      // The group is the ranks whose coordinates outside `dims` are r's.
      for (int q = 0; q < shape.world_size(); ++q) {
        bool same = true;
        for (MeshDim d : kDims)
          if (!dims.contains(d) && shape.coordinate(q, d) != shape.coordinate(r, d)) same = false;
        EXPECT_EQ(same, std::find(ranks.begin(), ranks.end(), q) != ranks.end())
            << dims.to_string() << " rank " << r << " peer " << q;
      }
      EXPECT_EQ(ranks[static_cast<size_t>(shape.rank_in_group(r, dims))], r) << dims.to_string();
      for (int q : ranks) EXPECT_EQ(shape.group_index(q, dims), shape.group_index(r, dims));
      ++members_of_group[static_cast<size_t>(shape.group_index(r, dims))];
    }
    // Group indices number the groups 0 .. world / group size - 1, each full.
    const int groups = shape.world_size() / shape.size(dims);
    for (int g = 0; g < shape.world_size(); ++g)
      EXPECT_EQ(members_of_group[static_cast<size_t>(g)], g < groups ? shape.size(dims) : 0)
          << dims.to_string() << " group " << g;
  }
}

TEST(MeshShape, ContextRanksShareTheirDataParallelRank) {
  const MeshShape shape = shape_of({{MeshDim::replicate, 2}, {MeshDim::shard, 2}, {MeshDim::context, 3}});
  EXPECT_EQ(shape.data_parallel_size(), 4);
  for (int r = 0; r < shape.world_size(); ++r) {
    EXPECT_EQ(shape.data_parallel_rank(r), r / 3) << r;
    for (int q : shape.group_ranks(r, {MeshDim::context}))
      EXPECT_EQ(shape.data_parallel_rank(q), shape.data_parallel_rank(r));
  }
  // Today's meshes: the data-parallel rank is the world rank.
  const MeshShape hybrid = shape_of({{MeshDim::replicate, 3}, {MeshDim::shard, 2}});
  EXPECT_EQ(hybrid.data_parallel_size(), 6);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(hybrid.data_parallel_rank(r), r);
}

TEST(MeshShape, ParsesAndPrintsTheFlag) {
  const MeshShape s = MeshShape::parse("replicate=2,shard=4");
  EXPECT_EQ(s.size(MeshDim::replicate), 2);
  EXPECT_EQ(s.size(MeshDim::shard), 4);
  EXPECT_EQ(s.world_size(), 8);
  EXPECT_EQ(s.to_string(), "replicate=2,shard=4");
  EXPECT_EQ(s.to_json().dump(), R"({"replicate":2,"shard":4})");
  EXPECT_EQ(MeshShape::parse("shard=4").to_string(), "replicate=1,shard=4");
  const MeshShape cp = MeshShape::parse("shard=2,context=2,tensor=1");
  EXPECT_EQ(cp.to_string(), "replicate=1,shard=2,context=2");
  EXPECT_EQ(MeshShape::parse(cp.to_string()), cp);
  EXPECT_EQ(cp.to_json().dump(), R"({"context":2,"replicate":1,"shard":2})");
  EXPECT_EQ(MeshShape().to_string(), "replicate=1,shard=1");
  EXPECT_EQ(MeshShape::from_json(cp.to_json()), cp);
  EXPECT_EQ(MeshShape::from_json(nlohmann::json::parse(R"({"shard":3})")).to_string(),
            "replicate=1,shard=3");
  EXPECT_NE(error_of([] { MeshShape::from_json(nlohmann::json::parse(R"({"data":3})")); })
                .find("unknown dimension 'data'"),
            std::string::npos);
  EXPECT_NE(error_of([] { MeshShape::from_json(nlohmann::json::parse(R"({"shard":0})")); })
                .find("size of shard"),
            std::string::npos);
}

TEST(MeshShape, RefusesBadSpellingsByName) {
  const auto error = [](const std::string& spec) { return error_of([&] { MeshShape::parse(spec); }); };
  EXPECT_NE(error("").find("--mesh is empty"), std::string::npos);
  EXPECT_NE(error("replicate=2,,shard=2").find("'' is not NAME=SIZE"), std::string::npos);
  EXPECT_NE(error("replicate2").find("'replicate2' is not NAME=SIZE"), std::string::npos);
  EXPECT_NE(error("data=2").find("unknown dimension 'data'"), std::string::npos);
  EXPECT_NE(error("shard=4,replicate=2").find("'replicate' comes out of order"), std::string::npos);
  EXPECT_NE(error("shard=2,shard=2").find("'shard' comes twice"), std::string::npos);
  EXPECT_NE(error("shard=0").find("size of shard must be a whole number >= 1, got '0'"),
            std::string::npos);
  EXPECT_NE(error("shard=2x").find("got '2x'"), std::string::npos);
  EXPECT_NE(error("shard=").find("got ''"), std::string::npos);
  EXPECT_NE(error("shard=-1").find("got '-1'"), std::string::npos);
}

TEST(MeshShape, ChecksTheWorldSizeInOneLine) {
  EXPECT_EQ(error_of([] { MeshShape::parse("replicate=2,shard=4").check_world(8); }), "");
  const std::string e = error_of([] { MeshShape::parse("replicate=2,shard=4").check_world(6); });
  EXPECT_EQ(e, "--mesh replicate=2,shard=4 lays out 8 rank(s) (2 x 4), the job has 6");
}

TEST(MeshShape, StrategiesRunOnTheObviousMeshes) {
  StrategyOptions o;
  for (StrategyKind kind :
       {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    o.kind = kind;
    EXPECT_EQ(strategy_mesh(o, 6).to_string(), "replicate=1,shard=6") << to_string(kind);
    EXPECT_EQ(partition_size(o, 6), 6);
  }
  o.kind = StrategyKind::hybrid;
  o.shard_group_size = 2;
  EXPECT_EQ(strategy_mesh(o, 6).to_string(), "replicate=3,shard=2");
  EXPECT_EQ(partition_size(o, 6), 2);
  o.shard_group_size = 4;
  EXPECT_NE(error_of([&] { strategy_mesh(o, 6); }).find("--shard-group-size 4 must divide the world size 6"),
            std::string::npos);
}

TEST(MeshShape, ContextParallelRanksJoinThePartition) {
  // Context ranks split sequences: they read the same rows (data parallelism stays
  // replicate x shard) and the unit partition spans shard x context.
  StrategyOptions o;
  o.kind = StrategyKind::zero3;
  o.context_parallel = 2;
  const MeshShape zero3 = strategy_mesh(o, 8);
  EXPECT_EQ(zero3.to_string(), "replicate=1,shard=4,context=2");
  EXPECT_EQ(partition_size(o, 8), 8);
  EXPECT_EQ(zero3.data_parallel_size(), 4);
  EXPECT_EQ(zero3.data_parallel_rank(2), zero3.data_parallel_rank(3));  // a context pair
  EXPECT_NE(zero3.data_parallel_rank(1), zero3.data_parallel_rank(2));
  o.kind = StrategyKind::hybrid;
  o.shard_group_size = 2;
  const MeshShape hybrid = strategy_mesh(o, 8);
  EXPECT_EQ(hybrid.to_string(), "replicate=2,shard=2,context=2");
  EXPECT_EQ(partition_size(hybrid), 4);
  EXPECT_EQ(hybrid.group_ranks(5, partition_dims()), (std::vector<int>{4, 5, 6, 7}));
  o.context_parallel = 3;
  EXPECT_EQ(error_of([&] { strategy_mesh(o, 8); }),
            "--context-parallel 3 must divide the world size 8 (each sequence is split over "
            "that many ranks)");
  o.context_parallel = 1;  // without context ranks: the meshes of before
  EXPECT_EQ(strategy_mesh(o, 8).to_string(), "replicate=4,shard=2");
}

TEST(MeshShape, TheTensorDimensionIsInnermostAndTheOthersShareTheRest) {
  // strategy_mesh lays out every dimension (the trainer, plan and the strategy all ask it):
  // the tensor ranks are the fastest, the strategy's dimensions split the world / T.
  StrategyOptions o;
  o.kind = StrategyKind::zero3;
  o.tensor_parallel = 2;
  EXPECT_EQ(strategy_mesh(o, 8).to_string(), "replicate=1,shard=4,tensor=2");
  EXPECT_EQ(partition_size(o, 8), 4);  // each tensor coordinate partitions its own pieces
  o.context_parallel = 2;
  const MeshShape three_d = strategy_mesh(o, 8);
  EXPECT_EQ(three_d.to_string(), "replicate=1,shard=2,context=2,tensor=2");
  EXPECT_EQ(three_d.group_ranks(5, {MeshDim::tensor}), (std::vector<int>{4, 5}));
  EXPECT_EQ(three_d.group_ranks(5, {MeshDim::context}), (std::vector<int>{5, 7}));
  o.kind = StrategyKind::hybrid;
  o.shard_group_size = 1;
  o.context_parallel = 1;
  EXPECT_EQ(strategy_mesh(o, 8).to_string(), "replicate=4,shard=1,tensor=2");
  o.tensor_parallel = 3;
  EXPECT_EQ(error_of([&] { strategy_mesh(o, 8); }),
            "--tensor-parallel 3 does not divide the job's 8 ranks (the tensor ranks are a "
            "factor of the world)");
}

TEST(MeshShape, TheExpertDimensionIsCarvedOutOfTheDataRanksOutsideTheContextOnes) {
  // Megatron's order: context ranks consecutive inside the expert ones, so a dense
  // unit's partition meets the data-parallel ranks in the order it does without experts.
  StrategyOptions o = experts_over_context(StrategyKind::zero3, 2, 2);
  const MeshShape m = strategy_mesh(o, 8);
  EXPECT_EQ(m.to_string(), "replicate=1,shard=2,expert=2,context=2");
  EXPECT_EQ(m.group_ranks(5, {MeshDim::context}), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_ranks(5, {MeshDim::expert}), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group_ranks(5, expert_partition_dims(m)), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(m.expert_group(), MeshDims{MeshDim::expert});
  EXPECT_EQ(m.expert_parallel_size(), 2);
  o.expert_parallel = 1;
  const MeshShape dense = strategy_mesh(o, 8);
  for (int r = 0; r < 8; ++r)  // the rows a rank reads: the same with and without experts
    EXPECT_EQ(m.data_parallel_rank(r), dense.data_parallel_rank(r)) << r;
  o.kind = StrategyKind::hybrid;  // carved out of each shard group of G ranks
  o.shard_group_size = 2;
  o.expert_parallel = 2;
  const MeshShape hybrid = strategy_mesh(o, 8);
  EXPECT_EQ(hybrid.to_string(), "replicate=2,shard=1,expert=2,context=2");
  EXPECT_EQ(hybrid.group_ranks(5, partition_dims()), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(hybrid.group_ranks(5, expert_partition_dims(hybrid)), (std::vector<int>{4, 5}));
  o.context_parallel = 1;
  o.expert_parallel = 4;
  EXPECT_EQ(error_of([&] { strategy_mesh(o, 4); }),
            "--expert-parallel 4 with --strategy hybrid: the experts spread over each shard "
            "group's 2 ranks (--shard-group-size), which 4 does not divide (expected a divisor "
            "of 2)");
}

TEST(MeshShape, AnExpertGroupLargerThanTheDataRanksSpansTheContextRanks) {
  // N=4, P=2: two data-parallel ranks; E=4 takes in the context ranks (Megatron-core's
  // EP over DP x CP): expert=E/P x context=P, every rank its own experts.
  StrategyOptions o = experts_over_context(StrategyKind::zero3, 2, 4);
  const MeshShape m = strategy_mesh(o, 4);
  EXPECT_EQ(m.to_string(), "replicate=1,shard=1,expert=2,context=2,expert_group=expert+context");
  EXPECT_TRUE(m.expert_spans_context());
  EXPECT_EQ(m.expert_group(), (MeshDims{MeshDim::expert, MeshDim::context}));
  EXPECT_EQ(m.expert_parallel_size(), 4);
  EXPECT_EQ(m.data_parallel_size(), 2);  // the context ranks still read the same rows
  EXPECT_EQ(m.group_ranks(1, m.expert_group()), (std::vector<int>{0, 1, 2, 3}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(m.expert_rank(r), r) << r;
  EXPECT_EQ(expert_partition_dims(m), MeshDims{MeshDim::shard});
  EXPECT_EQ(m.group_ranks(1, expert_partition_dims(m)), (std::vector<int>{1}));
  // The same sizes with E=2 are the expert dimension alone: the marker tells them apart.
  o.expert_parallel = 2;
  const MeshShape within = strategy_mesh(o, 4);
  EXPECT_EQ(within.to_string(), "replicate=1,shard=1,expert=2,context=2");
  EXPECT_NE(within, m);
  EXPECT_EQ(within.expert_parallel_size(), 2);
  // The marker survives the flag's spelling and the JSON (inspect prints run.json's).
  EXPECT_EQ(MeshShape::parse(m.to_string()), m);
  EXPECT_EQ(MeshShape::from_json(m.to_json()), m);
  EXPECT_EQ(m.to_json().at("expert_group"), "expert+context");
  EXPECT_EQ(MeshShape::from_json(within.to_json()), within);
  // N=2, P=2, E=2: no expert dimension left, the expert group is the context ranks.
  const MeshShape context_only = strategy_mesh(o, 2);
  EXPECT_EQ(context_only.to_string(), "replicate=1,shard=1,context=2,expert_group=expert+context");
  EXPECT_EQ(context_only.expert_parallel_size(), 2);
  EXPECT_EQ(MeshShape::parse(context_only.to_string()), context_only);
  // N=12, P=2, E=4: 4 does not divide the 6 data ranks but spans 2 of them x 2 context
  // ranks; the experts' partition is shard, E x (tensor) ranks apart.
  o.expert_parallel = 4;
  const MeshShape twelve = strategy_mesh(o, 12);
  EXPECT_EQ(twelve.to_string(), "replicate=1,shard=3,expert=2,context=2,expert_group=expert+context");
  EXPECT_EQ(twelve.group_ranks(5, twelve.expert_group()), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(twelve.group_ranks(5, expert_partition_dims(twelve)), (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(twelve.group_ranks(5, partition_dims()).size(), 12u);
  // hybrid: an E that a shard group's G data ranks cannot hold spans them x the P
  // context ranks (N=8, G=2, P=2, E=4: E divides the 4 data ranks, not G).
  o.kind = StrategyKind::hybrid;
  o.shard_group_size = 2;
  const MeshShape hybrid = strategy_mesh(o, 8);
  EXPECT_EQ(hybrid.to_string(), "replicate=2,shard=1,expert=2,context=2,expert_group=expert+context");
  EXPECT_EQ(hybrid.group_ranks(5, hybrid.expert_group()), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(hybrid.group_ranks(5, expert_partition_dims(hybrid)), (std::vector<int>{5}));
  o.expert_parallel = 8;
  EXPECT_EQ(error_of([&] { strategy_mesh(o, 8); }),
            "--expert-parallel 8 with --strategy hybrid: the experts spread over each shard "
            "group's 2 ranks (--shard-group-size), which 8 does not divide, or over them and "
            "their 2 context ranks, which needs a multiple of 2 dividing 4 (expected a divisor "
            "of 2 or a multiple of 2 dividing 4)");
  // What stays impossible: E not dividing N; E beyond the data ranks and no multiple of P.
  o.kind = StrategyKind::zero3;
  o.expert_parallel = 3;
  EXPECT_EQ(error_of([&] { strategy_mesh(o, 4); }),
            "--expert-parallel 3 does not divide the job's 4 ranks (expected a divisor of 4)");
  o.context_parallel = 4;
  o.expert_parallel = 6;
  EXPECT_EQ(error_of([&] { strategy_mesh(o, 12); }),
            "--expert-parallel 6 with --context-parallel 4: the experts spread over the 3 "
            "data-parallel ranks (the job's 12 / 4), which 6 does not divide, or over them and "
            "the context ranks, which needs a multiple of 4 (expected a divisor of 3 or a "
            "multiple of 4 dividing 12)");
}

TEST(MeshShape, TheExpertGroupMarkerIsCheckedWhereItIsRead) {
  const auto error = [](const std::string& spec) { return error_of([&] { MeshShape::parse(spec); }); };
  EXPECT_EQ(MeshShape::parse("expert=2,context=2,expert_group=expert"),
            MeshShape::parse("expert=2,context=2"));
  EXPECT_EQ(error("shard=4,expert_group=expert+context"),
            "--mesh 'shard=4,expert_group=expert+context': expert_group=expert+context needs a "
            "context dimension larger than 1");
  EXPECT_EQ(error("context=2,expert_group=tensor"),
            "--mesh 'context=2,expert_group=tensor': expert_group=tensor is not an expert group "
            "(expected expert or expert+context)");
  EXPECT_EQ(error("context=2,expert_group=expert+context,tensor=2"),
            "--mesh 'context=2,expert_group=expert+context,tensor=2': 'tensor=2' comes after "
            "expert_group (it goes last)");
  EXPECT_EQ(error_of([] {
              MeshShape::from_json(nlohmann::json::parse(R"({"shard":2,"expert_group":"expert+context"})"));
            }),
            R"(mesh {"expert_group":"expert+context","shard":2}: expert_group=expert+context needs a )"
            "context dimension larger than 1");
}

TEST(HostPlacement, ATensorGroupAcrossHostsIsAWarningNamingIt) {
  const MeshShape mesh = MeshShape::parse("shard=2,tensor=2");
  // Two ranks a host, the tensor groups {0, 1} and {2, 3} on one host each: no warning.
  EXPECT_EQ(tensor_groups_across_hosts_warning(mesh, {"a", "a", "b", "b"}), "");
  // One rank a host: the first group spans two hosts.
  EXPECT_EQ(tensor_groups_across_hosts_warning(mesh, {"a", "b", "c", "d"}),
            "--tensor-parallel 2: the tensor group of ranks 0..1 spans the hosts a, b; its "
            "exchanges (several per layer, each way) cross the network, which is slow: keep T "
            "within the ranks of one host (consecutive ranks share a tensor group)");
  // Only the second group spans hosts: it is the one named.
  EXPECT_NE(tensor_groups_across_hosts_warning(mesh, {"a", "a", "a", "b"}).find("ranks 2..3 spans the hosts a, b"),
            std::string::npos);
  // Without tensor ranks there is nothing to warn about.
  EXPECT_EQ(tensor_groups_across_hosts_warning(MeshShape::parse("shard=4"), {"a", "b", "c", "d"}), "");
}

TEST(HostPlacement, EveryRankLearnsEveryRanksHost) {
  InProcessJob job(3);
  std::vector<std::vector<std::string>> hosts(3);
  const std::vector<std::string> errors = job.run([&](Communicator& world) {
    hosts[static_cast<size_t>(world.rank())] = rank_hosts(world);
  });
  char mine[256] = {};
  ASSERT_EQ(gethostname(mine, sizeof(mine) - 1), 0);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(hosts[r], (std::vector<std::string>(3, mine))) << "rank " << r;
  }
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DeviceMesh, ThePartitionIsTheShardGroupWithoutContextRanks) {
  InProcessJob job(4);
  std::vector<std::string> names(4);
  expect_no_errors(job.run([&](Communicator& world) {
    DeviceMesh plain(MeshShape::parse("replicate=2,shard=2"), world, {partition_dims()});
    DeviceMesh context(MeshShape::parse("shard=2,context=2"), world,
                       {partition_dims(), {MeshDim::context}});
    names[static_cast<size_t>(world.rank())] =
        plain.group(partition_dims()).name() + " | " +
        (&context.group(partition_dims()) == &world ? "world" : "split") + " | " +
        context.group({MeshDim::context}).name() + " " +
        std::to_string(context.group({MeshDim::context}).rank());
  }));
  EXPECT_EQ(names[0], "shard group | world | context group 0");
  EXPECT_EQ(names[3], "shard group | world | context group 1");
}

TEST(DeviceMesh, GroupsHoldTheirRanksAndSumOverThem) {
  const MeshShape shape = MeshShape::parse("replicate=2,shard=3");
  InProcessJob job(6);
  std::vector<std::string> seen(6);
  expect_no_errors(job.run([&](Communicator& world) {
    DeviceMesh mesh(shape, world, {{MeshDim::shard}, {MeshDim::replicate}, MeshShape::data_parallel()});
    Communicator& shard = mesh.group({MeshDim::shard});
    Communicator& replica = mesh.group({MeshDim::replicate});
    EXPECT_EQ(&mesh.group(MeshShape::data_parallel()), &world);  // spans the world: no split
    // Sum of 10^world rank over each group: names which ranks took part.
    float s = 1.0f, q = 1.0f;
    for (int i = 0; i < world.rank(); ++i) s *= 10.0f, q *= 10.0f;
    shard.all_reduce(&s, 1, ReduceOp::sum, "shard sum").wait();
    replica.all_reduce(&q, 1, ReduceOp::sum, "replica sum").wait();
    seen[static_cast<size_t>(world.rank())] =
        fmt::format("{} {}/{} {} | {} {}/{} {}", shard.name(), shard.rank(), shard.size(), s,
                    replica.name(), replica.rank(), replica.size(), q);
    const CommCounters groups = mesh.take_group_counters();
    EXPECT_EQ(groups[CollectiveKind::all_reduce].calls, 2u);
    EXPECT_EQ(world.counters()[CollectiveKind::all_reduce].calls, 0u);
  }));
  EXPECT_EQ(seen[0], "shard group 0/3 111 | replica group 0/2 1001");
  EXPECT_EQ(seen[4], "shard group 1/3 111000 | replica group 1/2 10010");
  EXPECT_EQ(seen[2], "shard group 2/3 111 | replica group 0/2 100100");
}

TEST(DeviceMesh, AGroupNotAskedForIsAnErrorAndAWrongWorldIsRefused) {
  InProcessJob job(2);
  const auto errors = job.run([&](Communicator& world) {
    DeviceMesh mesh(MeshShape::parse("shard=2"), world, {{MeshDim::shard}});
    EXPECT_EQ(&mesh.group({MeshDim::shard}), &world);
    EXPECT_EQ(mesh.take_group_counters()[CollectiveKind::all_reduce].calls, 0u);
    EXPECT_NE(error_of([&] { mesh.group({MeshDim::replicate}); }).find("no replica group"),
              std::string::npos);
    DeviceMesh wrong(MeshShape::parse("shard=4"), world, {});
  });
  for (const auto& e : errors)
    EXPECT_EQ(e, "--mesh replicate=1,shard=4 lays out 4 rank(s) (4), the job has 2");
}

}  // namespace

TEST(PlacedMesh, SplitsTheModelParallelGroupsTheModelTalksOver) {
  // shard=2 x context=2 x tensor=2: the strategy's partition (shard x context), then
  // context and tensor (expert has one rank, so no group and a null pointer).
  const MeshShape shape = MeshShape::parse("shard=2,context=2,tensor=2");
  const std::vector<MeshDims> expected = {partition_dims(), {MeshDim::context}, {MeshDim::tensor}};
  EXPECT_EQ(run_mesh_groups(shape), expected);
  EXPECT_EQ(run_mesh_groups(MeshShape::parse("shard=4")), std::vector<MeshDims>{partition_dims()});
  InProcessJob job(8);
  std::vector<std::string> seen(8);
  expect_no_errors(job.run([&](Communicator& world) {
    PlacedMesh placed(shape, Device{}, world);
    const ModelParallelGroups groups = placed.model_groups();
    ASSERT_NE(groups.context, nullptr);
    ASSERT_NE(groups.tensor, nullptr);
    EXPECT_EQ(groups.expert, nullptr);
    EXPECT_EQ(groups.context, &placed.mesh().group({MeshDim::context}));
    // Sum of 10^world rank over each group: names which ranks took part.
    float c = 1.0f, t = 1.0f;
    for (int i = 0; i < world.rank(); ++i) c *= 10.0f, t *= 10.0f;
    groups.context->all_reduce(&c, 1, ReduceOp::sum, "context sum").wait();
    groups.tensor->all_reduce(&t, 1, ReduceOp::sum, "tensor sum").wait();
    seen[static_cast<size_t>(world.rank())] =
        fmt::format("{} {}/{} {} | {} {}/{} {}", groups.context->name(), groups.context->rank(),
                    groups.context->size(), c, groups.tensor->name(), groups.tensor->rank(),
                    groups.tensor->size(), t);
  }));
  // Tensor is innermost (neighbouring ranks), context strides over it.
  EXPECT_EQ(seen[0], "context group 0/2 101 | tensor group 0/2 11");
  EXPECT_EQ(seen[3], "context group 1/2 1010 | tensor group 1/2 1100");
  EXPECT_EQ(seen[5], "context group 0/2 10100000 | tensor group 1/2 110000");
}

TEST(PlacedMesh, AnExpertGroupSpanningTheContextRanksIsTheModelsExpertGroup) {
  // hybrid N=8 (G=2), P=2, E=4: replicate=2 x expert=2 x context=2; the model's expert
  // communicator is expert x context (a replica's four ranks, in the order of their
  // place in it), the experts' partition shard alone.
  StrategyOptions o = experts_over_context(StrategyKind::hybrid, 2, 4);
  o.shard_group_size = 2;
  const MeshShape shape = strategy_mesh(o, 8);
  const std::vector<MeshDims> expected = {partition_dims(), {MeshDim::replicate}, {MeshDim::shard},
                                          {MeshDim::context}, {MeshDim::expert, MeshDim::context}};
  EXPECT_EQ(run_mesh_groups(shape), expected);
  InProcessJob job(8);
  std::vector<std::string> seen(8);
  expect_no_errors(job.run([&](Communicator& world) {
    PlacedMesh placed(shape, Device{}, world);
    const ModelParallelGroups groups = placed.model_groups();
    ASSERT_NE(groups.expert, nullptr);
    ASSERT_NE(groups.context, nullptr);
    float e = 1.0f;
    for (int i = 0; i < world.rank(); ++i) e *= 10.0f;
    groups.expert->all_reduce(&e, 1, ReduceOp::sum, "expert sum").wait();
    seen[static_cast<size_t>(world.rank())] =
        fmt::format("{} {}/{} {}", groups.expert->name(), groups.expert->rank(), groups.expert->size(), e);
  }));
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(seen[static_cast<size_t>(r)],
              fmt::format("expert x context group {}/4 {}", r % 4, r < 4 ? "1111" : "11110000"))
        << r;
}

}  // namespace shardlm
