// plan under context parallelism: each rank of a context group computes T/P of every
// row's tokens (Ulysses: attention over whole rows for H/P heads), so a model unit's
// work per micro-batch is 1/P of the unsplit rank's, and the step's all-to-alls are on
// the wire.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "shardlm/model/param_layout.hpp"
#include "shardlm/plan/run_plan.hpp"

using namespace shardlm;

namespace {
// llama-tiny, two rows of 64 tokens on one rank.
RunPlanRequest tiny_request() {
  RunPlanRequest r;
  r.config = model_preset("llama-tiny");
  r.micro_batch = 2;
  r.seq_len = 64;
  r.global_batch = 2;
  r.world_size = 1;
  return r;
}
}  // namespace

TEST(ContextParallelPlan, ARankComputesItsShareOfEveryRow) {
  RunPlanRequest r = tiny_request();
  const RunPlan whole = plan_run(r);
  r.world_size = 2;
  r.strategy.context_parallel = 2;
  const RunPlan split = plan_run(r);
  ASSERT_EQ(whole.unit_work.size(), split.unit_work.size());
  for (size_t u = 0; u < whole.unit_work.size(); ++u) {
    const UnitWork& w = whole.unit_work[u];
    const UnitWork& s = split.unit_work[u];
    EXPECT_GT(w.forward.gemm_flops + w.forward.elementwise_bytes, 0.0) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.forward.gemm_flops, w.forward.gemm_flops / 2) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.forward.attention_flops, w.forward.attention_flops / 2) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.backward.gemm_flops, w.backward.gemm_flops / 2) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.forward.elementwise_bytes, w.forward.elementwise_bytes / 2) << "unit " << u;
  }
  EXPECT_EQ(whole.accumulation, split.accumulation);  // the context ranks share their rows
}

// Ring attention: the traced step records every ring step's send_recv on the context
// group (2 data-parallel ranks x P), a layer's k|v block (micro-batch x T/P tokens x
// 2 KV hd values, fp32) P - 1 times forward and P - 1 times backward, its gradient P
// times, each one message; a rank's GEMM work is its share of the tokens as under Ulysses.
TEST(ContextParallelPlan, RingSendsKeyValueBlocksAroundTheRing) {
  for (int P : {2, 4}) {
    RunPlanRequest r = tiny_request();
    const RunPlan whole = plan_run(r);
    r.world_size = 2 * P;
    r.global_batch = 4;
    r.strategy.context_parallel = P;
    r.model.context_parallel_kind = ContextParallelKind::ring;
    const RunPlan ring = plan_run(r);
    std::map<std::string, int> issued;
    for (const StepOp& op : ring.program.ops) {
      if (op.kind != StepOp::Kind::issue) continue;
      const PlannedCollective& c = ring.program.collectives.at(static_cast<size_t>(op.collective));
      if (c.kind != CollectiveKind::send_recv) continue;
      EXPECT_EQ(c.group, CommGroup::context) << c.label;
      const double block = 2.0 * (64 / P) * 2 * r.config.kv_heads() * r.config.head_dim() * 4;
      EXPECT_DOUBLE_EQ(c.bus_bytes, block) << c.label;
      EXPECT_DOUBLE_EQ(c.messages, 1.0) << c.label;
      ++issued[c.label];
    }
    const int L = r.config.n_layer, steps = kPlannedSteps;
    EXPECT_EQ(issued["ring k|v"], steps * L * (P - 1)) << "P=" << P;
    EXPECT_EQ(issued["ring k|v (backward)"], steps * L * (P - 1)) << "P=" << P;
    EXPECT_EQ(issued["ring k|v gradient"], steps * L * P) << "P=" << P;
    EXPECT_EQ(issued.size(), 3u);
    for (size_t u = 0; u < whole.unit_work.size(); ++u)
      EXPECT_DOUBLE_EQ(ring.unit_work[u].forward.gemm_flops, whole.unit_work[u].forward.gemm_flops / P)
          << "unit " << u;
    EXPECT_LT(ring.activations, whole.activations) << "P=" << P;
  }
}

// Hybrid (Ulysses groups of 2, ring across P / 2): the traced step runs the model's two
// sub-group splits (plan's recording communicator answers them) and records each
// layer's four Ulysses all-to-alls on the Ulysses group and the ring's send_recvs (its
// k|v block: micro-batch x 2T/P tokens x the group's 2 KV/2 hd values) on the ring, all
// placed with the context group; a rank's GEMM work is 1/P.
TEST(ContextParallelPlan, HybridRunsUlyssesInsideGroupsAndTheRingAcross) {
  const int P = 4, U = 2, R = P / U;
  RunPlanRequest r = tiny_request();
  const RunPlan whole = plan_run(r);
  r.world_size = 2 * P;
  r.global_batch = 4;
  r.strategy.context_parallel = P;
  r.model.context_parallel_kind = ContextParallelKind::hybrid;
  r.model.ulysses_degree = U;
  const RunPlan hybrid = plan_run(r);
  std::map<std::string, int> issued;
  for (const StepOp& op : hybrid.program.ops) {
    if (op.kind != StepOp::Kind::issue) continue;
    const PlannedCollective& c = hybrid.program.collectives.at(static_cast<size_t>(op.collective));
    if (c.kind != CollectiveKind::send_recv && c.kind != CollectiveKind::all_to_all) continue;
    EXPECT_EQ(c.group, CommGroup::context) << c.label;
    if (c.kind == CollectiveKind::send_recv) {
      const double block = 2.0 * (64 / R) * 2 * (r.config.kv_heads() / U) * r.config.head_dim() * 4;
      EXPECT_DOUBLE_EQ(c.bus_bytes, block) << c.label;
    }
    ++issued[c.label];
  }
  const int L = r.config.n_layer, steps = kPlannedSteps;
  EXPECT_EQ(issued["ring k|v"], steps * L * (R - 1));
  EXPECT_EQ(issued["ring k|v (backward)"], steps * L * (R - 1));
  EXPECT_EQ(issued["ring k|v gradient"], steps * L * R);
  for (const char* label : {"ulysses q|k|v", "ulysses attention output", "ulysses attention output gradient",
                            "ulysses q|k|v gradient"})
    EXPECT_EQ(issued[label], steps * L) << label;
  for (size_t u = 0; u < whole.unit_work.size(); ++u)
    EXPECT_DOUBLE_EQ(hybrid.unit_work[u].forward.gemm_flops, whole.unit_work[u].forward.gemm_flops / P)
        << "unit " << u;
  EXPECT_LT(hybrid.activations, whole.activations);
}

// Ulysses (and hybrid) save their own whole-row q|k|v for backward, so the model keeps
// one q|k|v array of its T/P tokens for every layer, and no log-sum-exp of its own:
// qwen3-0.6b at 4096 tokens, activations per rank 0.568 / 0.292 of P = 1's at P = 2 / 4
// (0.652 / 0.334 while every layer kept its q|k|v). What stays above 1/P: the attention
// output, kept as the model's [T/P tokens, all heads] for o_proj's gradient and as
// Ulysses' [T tokens, H/P heads] for the kernel's backward, and the exchange buffers.
TEST(ContextParallelPlan, UlyssesKeepsOneQkvArrayForEveryLayer) {
  RunPlanRequest r;
  r.config = model_preset("qwen3-0.6b");
  r.micro_batch = 1;
  r.seq_len = 4096;
  r.config.max_seq_len = 4096;
  r.global_batch = 1;
  r.world_size = 1;
  const double whole = static_cast<double>(plan_run(r).activations);
  for (const auto& [P, bound] : {std::pair{2, 0.6}, std::pair{4, 0.31}}) {
    r.world_size = P;
    r.strategy.context_parallel = P;
    const double split = static_cast<double>(plan_run(r).activations);
    EXPECT_LT(split / whole, bound) << "P=" << P;
    std::printf("qwen3-0.6b, 4096 tokens, ulysses P=%d: activations %.3f of P=1's\n", P, split / whole);
  }
}
