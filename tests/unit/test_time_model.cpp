// The step-time model's arithmetic on hand-computed cases: compute and collective
// durations, where groups sit, the simulation of one compute thread and one FIFO
// communication thread, and whole steps of ddp and zero3 whose timelines are worked
// out in the comments. Also: the collectives the step program issues carry exactly
// the bytes `plan` predicts (and measurement confirms, plan_matches_measurement.sh),
// for every strategy.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/plan/step_program.hpp"
#include "shardlm/plan/step_simulation.hpp"
#include "shardlm/parallel/strategy_options.hpp"
#include "shardlm/plan/time_model.hpp"

using namespace shardlm;

namespace {

StepOp compute_op(double gemm_flops) {
  StepOp op;
  op.kind = StepOp::Kind::compute;
  op.work.gemm_flops = gemm_flops;
  return op;
}
StepOp issue_op(int c) { return {StepOp::Kind::issue, {}, c, ""}; }
StepOp wait_op(int c) { return {StepOp::Kind::wait, {}, c, ""}; }
StepOp end_op() { return {StepOp::Kind::step_end, {}, -1, ""}; }

// Durations of compute ops = their gemm_flops (rate 1).
std::vector<double> unit_rate_durations(const StepProgram& p) {
  std::vector<double> d;
  for (const auto& op : p.ops) d.push_back(op.kind == StepOp::Kind::compute ? op.work.gemm_flops : 0);
  return d;
}

StepProgram program(int collectives, std::vector<StepOp> ops) {
  StepProgram p;
  p.collectives.resize(static_cast<size_t>(collectives));
  p.ops = std::move(ops);
  return p;
}

}  // namespace

TEST(TimeModel, ComputeSecondsSumsEachCountOverItsRate) {
  ComputeWork w{2e9, 1e9, 4e9, 1e9, 2e9};
  ComputeRates r{1e9, 0.5e9, 2e9, 1e9, 1e9};
  // 2 + 2 + 2 + 1 + 2
  EXPECT_DOUBLE_EQ(compute_seconds(w, r), 9.0);
}

TEST(TimeModel, CollectiveSecondsIsLatencyTimesMessagesPlusBytesOverSharedBandwidth) {
  const CollectiveRate rate{10e-6, 1e8};
  EXPECT_DOUBLE_EQ(collective_seconds(1e6, 3, rate, 1), 30e-6 + 0.01);
  EXPECT_DOUBLE_EQ(collective_seconds(1e6, 3, rate, 4), 30e-6 + 0.04);
  EXPECT_EQ(collective_seconds(0, 0, rate, 1), 0.0);
}

TEST(TimeModel, MessagesFollowTheAlgorithms) {
  const size_t scratch = size_t{4} << 20;  // 1 Mi floats
  EXPECT_EQ(collective_messages(CollectiveKind::all_gather, 1e6, 4, scratch, 4), 3);
  EXPECT_EQ(collective_messages(CollectiveKind::all_gather, 1e6, 1, scratch, 4), 0);
  // 16 MiB reduce-scatter on 2 ranks: 2 Mi floats per rank in chunks of 1 Mi floats.
  EXPECT_EQ(collective_messages(CollectiveKind::reduce_scatter, 16 << 20, 2, scratch, 4), 2);
  // On 3 ranks the chunk is 1 Mi / 2 floats: 4 Mi floats per rank take 8 rounds of 2.
  EXPECT_EQ(collective_messages(CollectiveKind::reduce_scatter, 48 << 20, 3, scratch, 4), 16);
  // A small all-reduce is one all-gather; a large one reduce-scatter + all-gather.
  EXPECT_EQ(collective_messages(CollectiveKind::all_reduce, 8, 4, scratch, 8), 3);
  EXPECT_EQ(collective_messages(CollectiveKind::all_reduce, 16 << 20, 2, scratch, 4), 3);
}

TEST(TimeModel, GroupsAcrossNodesShareTheLink) {
  // 2 nodes x 8 ranks.
  EXPECT_FALSE(place_group(CommGroup::world, 16, 16, 8).within_node);
  EXPECT_EQ(place_group(CommGroup::world, 16, 16, 8).nic_sharing, 1);
  EXPECT_TRUE(place_group(CommGroup::shard, 16, 8, 8).within_node);
  EXPECT_FALSE(place_group(CommGroup::shard, 16, 16, 8).within_node);
  // hybrid with groups of 8: 8 replica pairs cross the link at once; groups of 4: 4.
  EXPECT_FALSE(place_group(CommGroup::replica, 16, 8, 8).within_node);
  EXPECT_EQ(place_group(CommGroup::replica, 16, 8, 8).nic_sharing, 8);
  EXPECT_EQ(place_group(CommGroup::replica, 16, 4, 8).nic_sharing, 4);
  // Everything on one node.
  EXPECT_TRUE(place_group(CommGroup::world, 4, 4, 8).within_node);
  EXPECT_TRUE(place_group(CommGroup::replica, 8, 2, 8).within_node);
  // Expert parallelism E = 2: the ranks holding the same experts (shard x context) are
  // every other rank of the partition. zero3: the world's 16, across the link, both
  // expert coordinates' groups through it; hybrid with shard groups of 8: the group's 4,
  // on its node.
  EXPECT_FALSE(place_group(CommGroup::expert_data, 16, 16, 8, 2).within_node);
  EXPECT_EQ(place_group(CommGroup::expert_data, 16, 16, 8, 2).nic_sharing, 2);
  EXPECT_TRUE(place_group(CommGroup::expert_data, 16, 8, 8, 2).within_node);
}

TEST(TimeModel, AnExpertGroupSpanningTheContextRanksIsPlacedWhereTheMeshPutsIt) {
  // 16 ranks, P = 4 (4 data-parallel ranks), E = 8: the expert group takes in the
  // context ranks (expert=2 x context=4, shard=2): ranks 0..7, one node of 8; the ranks
  // that hold the same experts (shard) are 8 apart, across the link, each of a node's 8
  // groups through it. Placed as the expert dimension alone (P ranks apart) the group
  // would cross the link.
  StrategyOptions o;
  o.kind = StrategyKind::zero3;
  o.context_parallel = 4;
  o.expert_parallel = 8;
  const MeshShape mesh = strategy_mesh(o, 16);
  ASSERT_TRUE(mesh.expert_spans_context());
  EXPECT_EQ(mesh.group_ranks(0, mesh.expert_group()), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(mesh.group_ranks(0, expert_partition_dims(mesh)), (std::vector<int>{0, 8}));
  const int partition = partition_size(mesh);
  EXPECT_TRUE(place_group(CommGroup::expert, 16, partition, 8, 8, 1, 4, true).within_node);
  EXPECT_FALSE(place_group(CommGroup::expert, 16, partition, 8, 8, 1, 4, false).within_node);
  EXPECT_FALSE(place_group(CommGroup::expert_data, 16, partition, 8, 8, 1, 4, true).within_node);
  EXPECT_EQ(place_group(CommGroup::expert_data, 16, partition, 8, 8, 1, 4, true).nic_sharing, 8);
  // One node of 16: both on it.
  EXPECT_TRUE(place_group(CommGroup::expert_data, 16, partition, 16, 8, 1, 4, true).within_node);
}

TEST(StepSimulation, CommunicationShorterThanTheComputeAfterItIsHidden) {
  // compute 1, issue A (0.5), compute 1, wait A: A runs [1, 1.5], hidden.
  const auto p = program(1, {compute_op(1), issue_op(0), compute_op(1), wait_op(0), end_op()});
  const auto s = simulate_steps(p, unit_rate_durations(p), {0.5}, {1.0});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].step_s, 2.0);
  EXPECT_DOUBLE_EQ(s[0].exposed_s, 0.0);
  EXPECT_DOUBLE_EQ(s[0].compute_s, 2.0);
  EXPECT_DOUBLE_EQ(s[0].comm_busy_s, 0.5);
}

TEST(StepSimulation, TheRemainderIsExposed) {
  // A (1.5) runs [1, 2.5]; compute ends at 2; the wait exposes 0.5.
  const auto p = program(1, {compute_op(1), issue_op(0), compute_op(1), wait_op(0), end_op()});
  const auto s = simulate_steps(p, unit_rate_durations(p), {1.5}, {1.0});
  EXPECT_DOUBLE_EQ(s[0].step_s, 2.5);
  EXPECT_DOUBLE_EQ(s[0].exposed_s, 0.5);
  EXPECT_DOUBLE_EQ(s[0].overlap_cost_s, 0.0);
}

TEST(StepSimulation, ComputeSlowsWhileACollectiveSharesItsCores) {
  // Share 0.5, A (0.5) over [1, 1.5]: the second compute does 0.25 there, 0.75 after.
  const auto p = program(1, {compute_op(1), issue_op(0), compute_op(1), wait_op(0), end_op()});
  const auto s = simulate_steps(p, unit_rate_durations(p), {0.5}, {0.5});
  EXPECT_DOUBLE_EQ(s[0].step_s, 2.25);
  EXPECT_DOUBLE_EQ(s[0].overlap_cost_s, 0.25);
  EXPECT_DOUBLE_EQ(s[0].exposed_s, 0.0);
}

TEST(StepSimulation, CollectivesRunOneAtATimeInIssueOrder) {
  // A and B (1 each) issued at 0: B runs [1, 2]; the compute of 0.5 then waits 1.5.
  const auto p = program(2, {issue_op(0), issue_op(1), compute_op(0.5), wait_op(1), end_op(),
                             compute_op(1), end_op()});
  const auto s = simulate_steps(p, unit_rate_durations(p), {1, 1}, {1, 1});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_DOUBLE_EQ(s[0].step_s, 2.0);
  EXPECT_DOUBLE_EQ(s[0].exposed_s, 1.5);
  EXPECT_DOUBLE_EQ(s[1].step_s, 1.0);
  EXPECT_DOUBLE_EQ(s[1].exposed_s, 0.0);
}

namespace {

// Programs as the traced step records them for two model units, each its own flat
// unit of 1M elements on 2 ranks: forward 1 s, backward 2 s at a GEMM rate of 1
// FLOP/s; every big collective moves 2e6 bus bytes (0.5 s at 4e6 B/s); the trainer's
// three blocking scalar all-reduces (target count, loss sum, grad norm) around them.
class HandProgram {
 public:
  int issue(CollectiveKind kind, CommGroup group, double bus_bytes, std::string label) {
    p_.collectives.push_back({kind, group, bus_bytes, 0, std::move(label)});
    const int id = static_cast<int>(p_.collectives.size()) - 1;
    p_.ops.push_back({StepOp::Kind::issue, {}, id, ""});
    return id;
  }
  void wait(int id) { p_.ops.push_back({StepOp::Kind::wait, {}, id, ""}); }
  void compute(double gemm_flops) {
    ComputeWork w;
    w.gemm_flops = gemm_flops;
    p_.ops.push_back({StepOp::Kind::compute, w, -1, "unit"});
  }
  void scalar(CommGroup group, std::string label) {
    wait(issue(CollectiveKind::all_reduce, group, 8, std::move(label)));
  }
  int big(CollectiveKind kind, std::string label) {
    return issue(kind, CommGroup::shard, 2e6, std::move(label));
  }
  void end_step() { p_.ops.push_back({StepOp::Kind::step_end, {}, -1, ""}); }
  StepProgram take() { return std::move(p_); }

 private:
  StepProgram p_;
};

// ddp: buckets {1} then {0}, each a reduce-scatter and an all-gather, launched as
// backward completes their unit and waited for before the optimizer.
StepProgram ddp_program(int steps) {
  HandProgram h;
  for (int s = 0; s < steps; ++s) {
    h.scalar(CommGroup::world, "target count");
    h.compute(1), h.compute(1), h.compute(2);
    std::vector<int> bucket = {h.big(CollectiveKind::reduce_scatter, "rs 1"),
                               h.big(CollectiveKind::all_gather, "ag 1")};
    h.compute(2);
    bucket.push_back(h.big(CollectiveKind::reduce_scatter, "rs 0"));
    bucket.push_back(h.big(CollectiveKind::all_gather, "ag 0"));
    for (int id : bucket) h.wait(id);
    h.scalar(CommGroup::world, "loss sum");
    h.scalar(CommGroup::shard, "grad norm");
    h.end_step();
  }
  return h.take();
}

// zero3 with --prefetch 1, resharding after forward: each unit gathered before use
// (the next one prefetched), unit 1 kept from its forward through its backward (the
// next use), reduce-scatters issued as backward completes each unit and waited for
// before the optimizer; without prefetch each gather is issued when it is needed.
StepProgram zero3_program(int steps, bool prefetch) {
  HandProgram h;
  for (int s = 0; s < steps; ++s) {
    h.scalar(CommGroup::world, "target count");
    const auto gather = [&](const char* label) { return h.big(CollectiveKind::all_gather, label); };
    const int g0 = gather("ag 0");
    h.wait(g0);
    const int g1 = prefetch ? gather("ag 1") : -1;
    h.compute(1);  // forward 0, then unit 0 released
    const int g1_used = prefetch ? g1 : gather("ag 1");
    h.wait(g1_used);
    const int g0_again = prefetch ? gather("ag 0 for backward") : -1;
    h.compute(1);  // forward 1 (unit 1 kept for backward 1)
    h.compute(2);  // backward 1
    const int rs1 = h.big(CollectiveKind::reduce_scatter, "rs 1");
    const int g0_used = prefetch ? g0_again : gather("ag 0 for backward");
    h.wait(g0_used);
    h.compute(2);  // backward 0
    const int rs0 = h.big(CollectiveKind::reduce_scatter, "rs 0");
    h.wait(rs1);
    h.wait(rs0);
    h.scalar(CommGroup::world, "loss sum");
    h.scalar(CommGroup::shard, "grad norm");
    h.end_step();
  }
  return h.take();
}

HardwareProfile unit_profile(double share) {
  HardwareProfile p;
  p.name = "test";
  ComputeFigures c;
  c.ranks_per_node = 2;
  // GEMM 1 FLOP/s; state work (zeroing, AdamW) free.
  c.by_precision["fp32"] = {1, 1, 1, 1, 1e30};
  p.compute.push_back(c);
  p.ranks_per_node = 2;
  const CollectiveRate r{0, 4e6};
  p.intra_node = {"test", r, r, r, r, r, share};
  p.inter_node = p.intra_node;
  return p;
}

RunPlan plan_of(StepProgram program) {
  RunPlan plan;
  plan.world_size = 2;
  plan.partition = 2;
  plan.program = std::move(program);
  plan.tokens_per_step = 7;
  return plan;
}

// The three blocking scalar all-reduces (target count, loss sum, grad norm): 8 bus
// bytes each on 2 ranks at 4e6 B/s.
constexpr double kScalars = 3 * 8 / 4e6;

}  // namespace

TEST(TimeModel, DdpStepOnAHandTimeline) {
  // fwd 0 [0,1], fwd 1 [1,2], bwd 1 [2,4] -> bucket {1}: RS + AG [4,5];
  // bwd 0 [4,6] -> bucket {0}: RS + AG [6,7]; finish_gradients waits until 7.
  const auto t = predict_step_time(plan_of(ddp_program(kPlannedSteps)), unit_profile(1.0), {});
  EXPECT_NEAR(t.step_s, 7.0 + kScalars, 1e-12);
  EXPECT_NEAR(t.compute_s, 6.0, 1e-12);
  EXPECT_NEAR(t.exposed_s, 1.0 + kScalars, 1e-12);
  EXPECT_EQ(t.comm[static_cast<size_t>(CollectiveKind::reduce_scatter)].calls, 2);
  EXPECT_EQ(t.comm[static_cast<size_t>(CollectiveKind::all_gather)].calls, 2);
  EXPECT_NEAR(t.comm_s, 2.0 + kScalars, 1e-12);
  EXPECT_NEAR(t.tokens_per_s, 7 / t.step_s, 1e-12);
  // At half speed beside communication: bwd 0 gets 0.5 done over [4,5], ends at 6.5.
  const auto slow = predict_step_time(plan_of(ddp_program(kPlannedSteps)), unit_profile(0.5), {});
  EXPECT_NEAR(slow.step_s, 7.5 + kScalars, 1e-12);
  EXPECT_NEAR(slow.overlap_cost_s, 0.5, 1e-12);
}

TEST(TimeModel, Zero3StepWithPrefetchOnAHandTimeline) {
  // gather 0 [0,0.5] waited; prefetch gather 1 [0.5,1]; fwd 0 [0.5,1.5]; release 0;
  // fwd 1 [1.5,2.5] after prefetching 0 again for backward [1.5,2];
  // bwd 1 [2.5,4.5] -> RS 1 [4.5,5]; bwd 0 [4.5,6.5] -> RS 0 [6.5,7], waited.
  const auto t =
      predict_step_time(plan_of(zero3_program(kPlannedSteps, true)), unit_profile(1.0), {});
  EXPECT_NEAR(t.step_s, 7.0 + kScalars, 1e-12);
  EXPECT_NEAR(t.exposed_s, 1.0 + kScalars, 1e-12);
  EXPECT_EQ(t.comm[static_cast<size_t>(CollectiveKind::all_gather)].calls, 3);
  EXPECT_EQ(t.comm[static_cast<size_t>(CollectiveKind::reduce_scatter)].calls, 2);
  // Without prefetch every gather is waited for: 3 x 0.5 more exposed, step 8.5.
  const auto u = predict_step_time(plan_of(zero3_program(kPlannedSteps, false)), unit_profile(1.0), {});
  EXPECT_NEAR(u.step_s, 8.5 + kScalars, 1e-12);
}

TEST(TimeModel, ASlowerLinkBetweenNodesSlowsOnlyWhatCrossesIt) {
  // The same ddp step on 2 nodes x 1 rank: the profile's inter-node transport at a
  // quarter of the bandwidth makes each collective 2 s: bucket {1} [4,8] (half hidden
  // under bwd 0), bucket {0} [8,12].
  HardwareProfile p = unit_profile(1.0);
  const CollectiveRate slow{0, 1e6};
  p.inter_node = {"slow", slow, slow, slow, slow, slow, 1.0};
  const auto t = predict_step_time(plan_of(ddp_program(kPlannedSteps)), p, {2, ""});
  EXPECT_NEAR(t.step_s, 12.0 + 3 * 8 / 1e6, 1e-12);
  EXPECT_NEAR(t.exposed_s, 6.0 + 3 * 8 / 1e6, 1e-12);
  EXPECT_EQ(t.inter_transport, "slow");
}

namespace {

RunPlanRequest tiny_request(StrategyKind kind, int n) {
  RunPlanRequest r;
  r.config = model_preset("gpt2-tiny");
  r.config.n_layer = 3;
  r.config.n_embd = 64;
  r.config.n_head = 4;
  r.config.vocab_size = 256;
  r.world_size = n;
  r.strategy.kind = kind;
  r.micro_batch = 2;
  r.seq_len = 32;
  return r;
}

// The ops of the program's last (steady) step.
std::vector<StepOp> last_step(const StepProgram& p) {
  size_t first = 0;
  for (size_t i = 0, ends = 0; i + 1 < p.ops.size(); ++i)
    if (p.ops[i].kind == StepOp::Kind::step_end && ++ends == kPlannedSteps - 1) first = i + 1;
  return {p.ops.begin() + static_cast<std::ptrdiff_t>(first), p.ops.end()};
}

double program_bus_bytes_of_one_step(const RunPlan& plan) {
  double bytes = 0;
  for (const StepOp& op : last_step(plan.program))
    if (op.kind == StepOp::Kind::issue) {
      const PlannedCollective& c = plan.program.collectives[static_cast<size_t>(op.collective)];
      if (c.label != "target count" && c.label != "loss sum" && c.label != "grad norm")
        bytes += c.bus_bytes;
    }
  return bytes;
}

}  // namespace

TEST(StepProgram, CarriesExactlyThePlannedTrafficForEveryStrategy) {
  struct Case {
    StrategyKind kind;
    int n;
    int global_batch;
    DType precision;
    DType reduce;
    int group;
    bool reshard;
    int prefetch;
  };
  const Case cases[] = {
      {StrategyKind::ddp, 2, 0, DType::fp32, DType::fp32, 0, true, 1},
      {StrategyKind::zero1, 3, 0, DType::fp32, DType::fp32, 0, true, 1},
      {StrategyKind::zero2, 2, 8, DType::fp32, DType::fp32, 0, true, 1},
      {StrategyKind::zero3, 2, 0, DType::bf16, DType::bf16, 0, true, 2},
      {StrategyKind::zero3, 2, 8, DType::fp32, DType::fp32, 0, false, 1},
      {StrategyKind::zero3, 4, 0, DType::fp32, DType::fp32, 0, true, 0},
      {StrategyKind::hybrid, 4, 8, DType::fp32, DType::fp32, 2, true, 1},
      {StrategyKind::ddp, 2, 8, DType::bf16, DType::bf16, 0, true, 1},
  };
  for (const Case& c : cases) {
    RunPlanRequest r = tiny_request(c.kind, c.n);
    r.global_batch = c.global_batch;
    r.strategy.param_dtype = c.precision;
    r.model.precision = c.precision;
    r.strategy.reduce_dtype = c.reduce;
    r.strategy.shard_group_size = c.group;
    r.strategy.reshard_after_forward = c.reshard;
    r.strategy.prefetch = c.prefetch;
    const RunPlan plan = plan_run(r);
    // The wire bytes and the program both come from the traced step: the last step's
    // collectives, the scalar all-reduces left out, are the planned traffic.
    EXPECT_EQ(program_bus_bytes_of_one_step(plan), plan.wire_bytes_per_step)
        << to_string(c.kind) << " n=" << c.n;
  }
}

TEST(StepProgram, UnitWorkAddsUpToTheFamilysFlops) {
  RunPlanRequest r = tiny_request(StrategyKind::ddp, 1);
  r.micro_batch = 3;
  const RunPlan plan = plan_run(r);
  double flops = 0;
  for (const auto& w : plan.unit_work)
    flops += w.forward.gemm_flops + w.forward.attention_flops + w.backward.gemm_flops +
             w.backward.attention_flops;
  EXPECT_DOUBLE_EQ(flops, plan.flops_per_step);
  // The first unit only looks up embeddings; the last holds the tied head's GEMMs and
  // the loss; checkpointing adds each block's forward to its backward.
  EXPECT_EQ(plan.unit_work.front().forward.gemm_flops, 0);
  const double head = 2.0 * r.config.padded_vocab_size() * r.config.n_embd * 3 * 32;
  EXPECT_DOUBLE_EQ(plan.unit_work.back().forward.gemm_flops, head);
  EXPECT_GT(plan.unit_work.back().forward.loss_bytes, 0);
  r.model.activation_checkpointing = true;
  const RunPlan ckpt = plan_run(r);
  EXPECT_DOUBLE_EQ(ckpt.unit_work[1].backward.gemm_flops,
                   plan.unit_work[1].backward.gemm_flops + plan.unit_work[1].forward.gemm_flops);
}

TEST(StepProgram, UnitWorkOfTheLlamaFamiliesAddsUpToTheirFlops) {
  for (const char* preset : {"llama-tiny", "qwen2-tiny", "qwen3-tiny"}) {
    RunPlanRequest r;
    r.config = model_preset(preset);
    r.micro_batch = 2;
    r.seq_len = 32;
    const RunPlan plan = plan_run(r);
    double flops = 0, attention = 0;
    for (const auto& w : plan.unit_work) {
      flops += w.forward.gemm_flops + w.forward.attention_flops + w.backward.gemm_flops +
               w.backward.attention_flops;
      attention += w.forward.attention_flops;
    }
    EXPECT_NEAR(flops, plan.flops_per_step, 1e-9 * plan.flops_per_step) << preset;
    EXPECT_GT(attention, 0) << preset;  // the family counts attention beyond the GEMMs
    EXPECT_EQ(plan.unit_work.front().forward.gemm_flops, 0) << preset;
  }
}

// ---- adapters: frozen units cost no weight gradients and no state (hand-computed) ----

namespace {

// A llama of one layer small enough to count by hand: C = 8, two query heads and one
// key/value head of 4 (Q = 8, KV = 4), MLP width I = 16, vocabulary 64 (a multiple of
// the padding, tied head). Matrices of the layer: q|k|v (8 + 4 + 4) x 8 = 128, o 8 x 8
// = 64, gate|up 2 x 16 x 8 = 256, down 8 x 16 = 128: 576 elements; the head 64 x 8 =
// 512. Vectors: the two norms of the layer (8 + 8), the final norm (8).
// With --lora-rank 2 on q_proj and v_proj: A_q|A_v [4, 8] = 32, B_q [8, 2] = 16,
// B_v [4, 2] = 8: 56 adapter elements. Micro-batch 2 x 16 = 32 tokens on one rank.
RunPlanRequest hand_llama(bool lora) {
  RunPlanRequest r;
  r.config = model_preset("llama-tiny");
  r.config.n_layer = 1;
  r.config.n_embd = 8;
  r.config.n_head = 2;
  r.config.n_kv_head = 1;
  r.config.head_dim_override = 4;
  r.config.intermediate_size = 16;
  r.config.vocab_size = 64;
  r.config.tie_embeddings = true;
  r.config.rope_scaling = RopeScaling{};
  if (lora) {
    r.config.lora.rank = 2;
    r.config.lora.targets = {"q_proj", "v_proj"};
  }
  r.min_unit_params = 0;  // no merging: one flat unit per model unit
  r.micro_batch = 2;
  r.seq_len = 16;
  return r;
}

constexpr double kTokens = 32;
constexpr double kLayerMatrix = 576, kHead = 512, kAdapters = 56;
// Causal attention of the kernels: scores and values 2 x 2 x T x Q per token forward,
// halved by causality; backward twice that. One layer, T = 16, Q = 8.
constexpr double kAttentionPerToken = 6.0 * 16 * 8;

ComputeWork step_state(const RunPlan& plan) {
  ComputeWork w;
  for (const StepOp& op : last_step(plan.program))
    if (op.kind == StepOp::Kind::compute) {
      w.state_bytes += op.work.state_bytes;
      w.optimizer_bytes += op.work.optimizer_bytes;
    }
  return w;
}

}  // namespace

TEST(UnitWork, FullFineTuningOnAHandCountedLlama) {
  const RunPlan plan = plan_run(hand_llama(false));
  ASSERT_EQ(plan.unit_work.size(), 3u);  // embeddings, layer 0, final
  const UnitWork& embed = plan.unit_work[0];
  const UnitWork& layer = plan.unit_work[1];
  const UnitWork& final = plan.unit_work[2];
  EXPECT_EQ(embed.forward.gemm_flops, 0);
  EXPECT_DOUBLE_EQ(embed.forward.elementwise_bytes, 8 * 8 * kTokens);  // one row of C per token
  EXPECT_DOUBLE_EQ(embed.backward.elementwise_bytes, 2 * 8 * 8 * kTokens);
  EXPECT_DOUBLE_EQ(layer.forward.gemm_flops, 2 * kLayerMatrix * kTokens);
  EXPECT_DOUBLE_EQ(layer.backward.gemm_flops, 4 * kLayerMatrix * kTokens);  // dX + dW
  EXPECT_DOUBLE_EQ(layer.forward.attention_flops, kAttentionPerToken * kTokens / 3);
  EXPECT_DOUBLE_EQ(layer.backward.attention_flops, 2 * kAttentionPerToken * kTokens / 3);
  // 8 bytes per token for each norm element and each matrix element / C.
  EXPECT_DOUBLE_EQ(layer.forward.elementwise_bytes, 8 * (16 + kLayerMatrix / 8) * kTokens);
  EXPECT_DOUBLE_EQ(final.forward.gemm_flops, 2 * kHead * kTokens);  // the tied head
  EXPECT_DOUBLE_EQ(final.backward.gemm_flops, 4 * kHead * kTokens);
  EXPECT_DOUBLE_EQ(final.forward.loss_bytes, 8 * 64 * kTokens);
  // State on one rank, ddp, fp32: every unit trains. Flat units (parameters start at
  // multiples of 16 elements): embeddings 512; the layer's input norm [0, 8), q|k|v
  // [16, 144), o [144, 208), post-attention norm [208, 216), gate|up [224, 480), down
  // [480, 608): 608; the final norm 8, padded to 16: 1136 elements. Zeroing and the
  // norm read or write 4 bytes each, AdamW 28.
  const ComputeWork state = step_state(plan);
  EXPECT_DOUBLE_EQ(state.state_bytes, (4 + 4) * 1136.0);
  EXPECT_DOUBLE_EQ(state.optimizer_bytes, 28 * 1136.0);
}

TEST(UnitWork, LoraFrozenUnitsHaveNoWeightGradientsAndNoState) {
  const RunPlan plan = plan_run(hand_llama(true));
  ASSERT_EQ(plan.unit_work.size(), 4u);  // embeddings, adapters 0, layer 0, final
  const UnitWork& embed = plan.unit_work[0];
  const UnitWork& adapters = plan.unit_work[1];
  const UnitWork& layer = plan.unit_work[2];
  const UnitWork& final = plan.unit_work[3];
  // The adapter unit holds parameters; its layer multiplies them.
  EXPECT_TRUE(adapters.forward.empty());
  EXPECT_TRUE(adapters.backward.empty());
  // Frozen base: 2 forward + 2 for dX; adapters 2 + 2 (dX) + 2 (dW).
  EXPECT_DOUBLE_EQ(layer.forward.gemm_flops, 2 * (kLayerMatrix + kAdapters) * kTokens);
  EXPECT_DOUBLE_EQ(layer.backward.gemm_flops, (2 * kLayerMatrix + 4 * kAdapters) * kTokens);
  EXPECT_DOUBLE_EQ(final.backward.gemm_flops, 2 * kHead * kTokens);  // frozen head: dX only
  // Attention is the kernels' own, as in full fine-tuning, all on the layer.
  EXPECT_DOUBLE_EQ(layer.forward.attention_flops, kAttentionPerToken * kTokens / 3);
  EXPECT_DOUBLE_EQ(layer.backward.attention_flops, 2 * kAttentionPerToken * kTokens / 3);
  // The frozen embedding's backward writes nothing.
  EXPECT_DOUBLE_EQ(embed.forward.elementwise_bytes, 8 * 8 * kTokens);
  EXPECT_EQ(embed.backward.elementwise_bytes, 0);
  EXPECT_DOUBLE_EQ(layer.forward.elementwise_bytes,
                   8 * (16 + (kLayerMatrix + kAdapters) / 8) * kTokens);
  // The model's FLOPs per token for LoRA (4 per frozen, 6 per adapter element, plus
  // attention) are exactly what the units add up to.
  double flops = 0;
  for (const auto& w : plan.unit_work)
    flops += w.forward.gemm_flops + w.forward.attention_flops + w.backward.gemm_flops +
             w.backward.attention_flops;
  EXPECT_DOUBLE_EQ(flops, (4 * (kLayerMatrix + kHead) + 6 * kAdapters + kAttentionPerToken) * kTokens);
  EXPECT_DOUBLE_EQ(flops, plan.flops_per_step);
  // State: only the adapter unit (56 elements, padded to 64) has gradients and AdamW.
  const ComputeWork state = step_state(plan);
  EXPECT_DOUBLE_EQ(state.state_bytes, (4 + 4) * 64.0);
  EXPECT_DOUBLE_EQ(state.optimizer_bytes, 28 * 64.0);
}

TEST(UnitWork, LoraStateOnFourRanksForEveryStrategy) {
  // 4 ranks: units padded to multiples of 64; the adapter unit is 64 elements, a
  // slice of 16. ddp zeroes the whole unit and updates it all; zero1 zeroes it all
  // and updates a slice; zero2/zero3 zero the owned slice, and also zero the gradient
  // buffer of the unit (64) when backward first writes it and accumulate the reduced
  // slice (12 bytes per element: read both, write one). The norm reads the slice.
  struct Case {
    StrategyKind kind;
    double state, optimizer;
  };
  const Case cases[] = {
      {StrategyKind::ddp, 4 * 64 + 4 * 16, 28 * 64},
      {StrategyKind::zero1, 4 * 64 + 4 * 16, 28 * 16},
      {StrategyKind::zero2, 4 * 16 + 4 * 64 + 12 * 16 + 4 * 16, 28 * 16},
  };
  for (const Case& c : cases) {
    RunPlanRequest r = hand_llama(true);
    r.world_size = 4;
    r.strategy.kind = c.kind;
    const ComputeWork state = step_state(plan_run(r));
    EXPECT_DOUBLE_EQ(state.state_bytes, c.state) << to_string(c.kind);
    EXPECT_DOUBLE_EQ(state.optimizer_bytes, c.optimizer) << to_string(c.kind);
  }
}

TEST(UnitWork, QloraDequantizesEachLayerOnceForwardAndOnceBackward) {
  // NF4 storage, in 4-byte words, of n values: ceil(n / 64) absmax words, then two
  // codes per byte: q 64 values -> 1 + 8 = 9 words, k and v 32 -> 1 + 4 = 5 each, o 64
  // -> 9, gate, up and down 128 -> 2 + 16 = 18 each: 82 words read, and the 576
  // values written in fp32 (4 bytes; bf16 runs write 2).
  RunPlanRequest r = hand_llama(true);
  const RunPlan lora = plan_run(r);
  r.config.quantize_base = BaseQuant::nf4;
  const RunPlan qlora = plan_run(r);
  const double dequantize = 4 * 82 + 4 * kLayerMatrix;
  EXPECT_DOUBLE_EQ(qlora.unit_work[2].forward.elementwise_bytes,
                   lora.unit_work[2].forward.elementwise_bytes + dequantize);
  EXPECT_DOUBLE_EQ(qlora.unit_work[2].backward.elementwise_bytes,
                   lora.unit_work[2].backward.elementwise_bytes + dequantize);
  EXPECT_DOUBLE_EQ(qlora.unit_work[2].forward.gemm_flops, lora.unit_work[2].forward.gemm_flops);
  r.model.precision = r.strategy.param_dtype = DType::bf16;
  const RunPlan bf16 = plan_run(r);
  r.config.quantize_base = BaseQuant::none;
  const RunPlan bf16_lora = plan_run(r);
  EXPECT_DOUBLE_EQ(bf16.unit_work[2].forward.elementwise_bytes,
                   bf16_lora.unit_work[2].forward.elementwise_bytes + 4 * 82 + 2 * kLayerMatrix);
  // Checkpointing recomputes the layer's forward, not its dequantization (one
  // conversion serves the recompute and the backward).
  r.config.quantize_base = BaseQuant::nf4;
  r.model.activation_checkpointing = true;
  const RunPlan ckpt = plan_run(r);
  EXPECT_DOUBLE_EQ(ckpt.unit_work[2].backward.elementwise_bytes,
                   bf16.unit_work[2].backward.elementwise_bytes +
                       bf16_lora.unit_work[2].forward.elementwise_bytes);
}

TEST(UnitWork, AttentionIsTheKernelsOwnAtEveryLengthWithOrWithoutAdapters) {
  // qwen3-8b: 36 layers, 32 query heads of 128: 6 x T x 4096 FLOPs per token and layer.
  for (int seq_len : {512, 4096, 32768})
    for (int rank : {0, 8}) {
      RunPlanRequest r;
      r.config = model_preset("qwen3-8b");
      r.config.lora.rank = rank;
      if (rank > 0) r.config.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
      r.micro_batch = 1;
      r.seq_len = seq_len;
      const RunPlan plan = plan_run(r);
      double attention = 0;
      for (const auto& w : plan.unit_work) attention += w.forward.attention_flops + w.backward.attention_flops;
      EXPECT_NEAR(attention, 36 * 6.0 * seq_len * 4096 * seq_len, 1e-6 * attention)
          << "T=" << seq_len << " rank " << rank;
    }
}

TEST(TimeModel, LoraStateTimeIsTheAdaptersOnly) {
  // The same hand-counted model, timed at a state rate of 1 byte/s (everything else
  // free): full fine-tuning 36 x 1136 bytes, LoRA 36 x 64.
  HardwareProfile p;
  p.name = "state";
  ComputeFigures c;
  c.by_precision["fp32"] = {1e30, 1e30, 1e30, 1e30, 1};
  p.compute.push_back(c);
  const CollectiveRate r{0, 1e30};
  p.intra_node = {"test", r, r, r, r, r, 1.0};
  p.inter_node = p.intra_node;
  const auto full = predict_step_time(plan_run(hand_llama(false)), p, {});
  const auto lora = predict_step_time(plan_run(hand_llama(true)), p, {});
  EXPECT_NEAR(full.state_s, 36 * 1136.0, 1e-6);
  EXPECT_NEAR(full.optimizer_s, 28 * 1136.0, 1e-6);
  EXPECT_NEAR(lora.state_s, 36 * 64.0, 1e-6);
  EXPECT_NEAR(lora.optimizer_s, 28 * 64.0, 1e-6);
}

// ---- the traced program follows the real hooks ----

namespace {

struct LabelledOp {
  StepOp::Kind kind;
  std::string label;  // the collective's for issue/wait, the compute's otherwise
};

std::vector<LabelledOp> labelled_last_step(const RunPlan& plan) {
  std::vector<LabelledOp> out;
  for (const StepOp& op : last_step(plan.program))
    out.push_back({op.kind, op.collective >= 0
                                ? plan.program.collectives[static_cast<size_t>(op.collective)].label
                                : op.label});
  return out;
}

size_t index_of(const std::vector<LabelledOp>& ops, StepOp::Kind kind, const std::string& label) {
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == kind && ops[i].label == label) return i;
  ADD_FAILURE() << "no op " << label;
  return ops.size();
}

}  // namespace

TEST(TracedProgram, DdpReducesDuringTheLastBackwardAndWaitsBeforeTheLoss) {
  RunPlanRequest r = tiny_request(StrategyKind::ddp, 2);
  r.min_unit_params = 1;  // one flat unit per model unit
  const RunPlan plan = plan_run(r);
  const auto ops = labelled_last_step(plan);
  size_t first_backward = ops.size(), last_backward = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == StepOp::Kind::compute && ops[i].label.rfind("backward unit", 0) == 0)
      first_backward = std::min(first_backward, i), last_backward = i;
  ASSERT_LT(first_backward, last_backward);
  const size_t loss = index_of(ops, StepOp::Kind::issue, "loss sum");
  EXPECT_EQ(ops.front().label, "target count");
  int reductions = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].label.rfind("reduce_scatter grads", 0) != 0) continue;
    if (ops[i].kind == StepOp::Kind::issue) {
      ++reductions;
      EXPECT_GT(i, first_backward) << ops[i].label;  // launched as backward completes units
    } else {
      EXPECT_GT(i, last_backward) << ops[i].label;  // waited by finish_gradients
      EXPECT_LT(i, loss) << ops[i].label;
    }
  }
  EXPECT_EQ(reductions, 5);  // embeddings, 3 blocks, final norm: one per trainable unit
}

TEST(TracedProgram, Zero3WaitsForEachGatherBeforeTheUnitUsesIt) {
  for (int prefetch : {0, 1, 2}) {
    RunPlanRequest r = tiny_request(StrategyKind::zero3, 2);
    r.min_unit_params = 1;
    r.strategy.prefetch = prefetch;
    const RunPlan plan = plan_run(r);
    const ParamLayout layout = ParamLayout::build(r.config, 2, r.min_unit_params);
    const auto needs = model_family(r.config.family).unit_needs(r.config);
    const auto ops = labelled_last_step(plan);
    // The newest gather of each flat unit, and whether it was waited for since.
    std::map<std::string, bool> waited;
    for (const LabelledOp& op : ops) {
      if (op.label.rfind("all_gather params unit ", 0) == 0)
        waited[op.label] = op.kind == StepOp::Kind::wait;
      const bool unit_pass = op.label.rfind("forward unit ", 0) == 0 ||
                             op.label.rfind("backward unit ", 0) == 0;
      if (op.kind != StepOp::Kind::compute || !unit_pass) continue;
      const int m = std::stoi(op.label.substr(op.label.rfind(' ') + 1));
      for (int v : needs[static_cast<size_t>(m)]) {
        const auto& unit = layout.units[static_cast<size_t>(layout.model_units[static_cast<size_t>(v)].unit)];
        const std::string gather = "all_gather params unit " + unit.name;
        ASSERT_TRUE(waited.count(gather)) << op.label << " without " << gather;
        EXPECT_TRUE(waited[gather]) << op.label << " before its " << gather << " was waited for";
      }
    }
  }
}
