// plan under context parallelism: each rank of a context group computes T/P of every
// row's tokens (Ulysses: attention over whole rows for H/P heads), so a model unit's
// work per micro-batch is 1/P of the unsplit rank's, and the step's all-to-alls are on
// the wire.
#include <gtest/gtest.h>

#include "shardlm/model/param_layout.hpp"
#include "shardlm/plan/run_plan.hpp"

using namespace shardlm;

TEST(ContextParallelPlan, ARankComputesItsShareOfEveryRow) {
  RunPlanRequest r;
  r.config = model_preset("llama-tiny");
  r.micro_batch = 2;
  r.seq_len = 64;
  r.global_batch = 2;
  r.world_size = 1;
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
