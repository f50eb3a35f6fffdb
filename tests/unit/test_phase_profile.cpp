// The phase profile: exclusive accounting of nested scopes, per-thread totals that
// a take resets, and the kernels that charge their phase. Timings are only compared
// with each other and with sleeps (which last at least as long as asked), never
// with an expected speed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/embedding.hpp"
#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/cpu/lm_head_loss.hpp"
#include "shardlm/core/phase_profile.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/optim/adamw.hpp"

using namespace shardlm;

namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

TEST(PhaseProfile, NestedScopeIsChargedToTheInnerPhaseOnly) {
  take_phase_totals();
  Stopwatch outside;
  {
    const PhaseScope loss(Phase::loss);
    sleep_ms(10);
    {
      const PhaseScope gemm(Phase::gemm);
      sleep_ms(30);
    }
    sleep_ms(10);
  }
  const double wall = outside.seconds();
  const PhaseTotals t = take_phase_totals();
  const double gemm = t.seconds_of(Phase::gemm), loss = t.seconds_of(Phase::loss);
  EXPECT_GE(gemm, 0.030);
  EXPECT_GE(loss, 0.020);
  // The outer scope's own time excludes the inner one: had the GEMM been counted in
  // loss as well, loss + gemm would exceed the wall time around both.
  EXPECT_LE(loss + gemm, wall + 1e-9);
  EXPECT_LE(loss, wall - gemm + 1e-9);
  EXPECT_DOUBLE_EQ(t.total_seconds(), loss + gemm);
  EXPECT_EQ(t.calls_of(Phase::loss), 1);
  EXPECT_EQ(t.calls_of(Phase::gemm), 1);
  EXPECT_EQ(t.calls_of(Phase::attention), 0);
  EXPECT_EQ(t.seconds_of(Phase::attention), 0.0);
}

TEST(PhaseProfile, SiblingsAndDeepNestingSumToTheOutermostScope) {
  take_phase_totals();
  Stopwatch outside;
  {
    const PhaseScope outer(Phase::optimizer);
    for (int i = 0; i < 3; ++i) {
      const PhaseScope mid(Phase::norms_elementwise);
      sleep_ms(2);
      {
        const PhaseScope inner(Phase::norms_elementwise);  // same phase, nested
        sleep_ms(3);
      }
    }
    sleep_ms(5);
  }
  const double wall = outside.seconds();
  const PhaseTotals t = take_phase_totals();
  EXPECT_EQ(t.calls_of(Phase::norms_elementwise), 6);
  EXPECT_EQ(t.calls_of(Phase::optimizer), 1);
  EXPECT_GE(t.seconds_of(Phase::norms_elementwise), 0.015);
  EXPECT_GE(t.seconds_of(Phase::optimizer), 0.005);
  EXPECT_GE(t.total_seconds(), 0.020);  // every slept millisecond is somewhere
  EXPECT_LE(t.total_seconds(), wall + 1e-9);  // and none twice
}

TEST(PhaseProfile, TakeResetsTheTotals) {
  {
    const PhaseScope scope(Phase::attention);
    sleep_ms(1);
  }
  const PhaseTotals first = take_phase_totals();
  EXPECT_GE(first.seconds_of(Phase::attention), 0.001);
  EXPECT_EQ(first.calls_of(Phase::attention), 1);
  const PhaseTotals second = take_phase_totals();
  EXPECT_EQ(second.total_seconds(), 0.0);
  for (int p = 0; p < kNumPhases; ++p) EXPECT_EQ(second.calls[p], 0);
}

TEST(PhaseProfile, EachThreadKeepsItsOwnTotals) {
  take_phase_totals();
  PhaseTotals from_thread;
  std::thread worker([&] {
    {
      const PhaseScope scope(Phase::gemm);
      sleep_ms(5);
    }
    from_thread = take_phase_totals();
  });
  worker.join();
  EXPECT_EQ(from_thread.calls_of(Phase::gemm), 1);
  EXPECT_GE(from_thread.seconds_of(Phase::gemm), 0.005);
  const PhaseTotals mine = take_phase_totals();
  EXPECT_EQ(mine.calls_of(Phase::gemm), 0);
  EXPECT_EQ(mine.total_seconds(), 0.0);
}

TEST(PhaseProfile, PhaseNamesAreDistinct) {
  std::set<std::string> names;
  for (int p = 0; p < kNumPhases; ++p) names.insert(std::string(phase_name(static_cast<Phase>(p))));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumPhases));
  EXPECT_EQ(phase_name(Phase::norms_elementwise), "norms_elementwise");
}

// The kernels open their phase at entry: one GEMM call is one gemm scope, and the
// fused LM-head loss charges its three GEMMs per chunk to gemm, not to loss.
TEST(PhaseProfile, KernelsChargeTheirPhase) {
  take_phase_totals();
  std::vector<float> a(64 * 64, 0.5f), b(64 * 64, 0.25f), c(64 * 64);
  cpu::sgemm(false, false, 64, 64, 64, 1.0f, a.data(), 64, b.data(), 64, 0.0f, c.data(), 64);
  PhaseTotals t = take_phase_totals();
  EXPECT_EQ(t.calls_of(Phase::gemm), 1);
  EXPECT_EQ(t.calls_of(Phase::loss), 0);

  const int N = 6, C = 16, V = 40, chunk = 4;  // two chunks: 4 + 2 rows
  std::vector<float> x(N * C, 0.1f), weight(V * C, 0.05f), logits(chunk * V), losses(N),
      dx(N * C), dweight(V * C, 0.0f);
  std::vector<int32_t> targets = {1, 2, 3, 4, 5, 6};
  cpu::LmHeadLossArgs args;
  args.x = x.data();
  args.weight = weight.data();
  args.targets = targets.data();
  args.N = N;
  args.C = C;
  args.V = V;
  args.logits_scratch = logits.data();
  args.logits_stride = V;
  args.chunk_rows = chunk;
  Stopwatch outside;
  cpu::lm_head_cross_entropy(args, losses.data(), dx.data(), dweight.data());
  const double wall = outside.seconds();
  t = take_phase_totals();
  EXPECT_EQ(t.calls_of(Phase::loss), 1);
  EXPECT_EQ(t.calls_of(Phase::gemm), 6);  // forward, dx and dweight per chunk
  EXPECT_LE(t.seconds_of(Phase::loss) + t.seconds_of(Phase::gemm), wall + 1e-9);

  const int T = 8, H = 2;
  std::vector<float> qkv(T * 3 * C, 0.1f), out(T * C), lse(H * T);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), {1, T, H, H, C / H});
  std::vector<float> mean(T), rstd(T), ln_w(C, 1.0f), ln_b(C, 0.0f);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), qkv.data(), ln_w.data(),
                         ln_b.data(), T, C);
  std::vector<int32_t> tokens(T, 3);
  cpu::embedding_forward(out.data(), tokens.data(), weight.data(), qkv.data(), 1, T, C);
  std::vector<float> p(32, 1.0f), g(32, 0.5f), m(32, 0.0f), v(32, 0.0f);
  adamw_update(p.data(), g.data(), m.data(), v.data(), 32, {}, 1e-3f, 1.0f, 1, AdamWConfig{});
  sum_of_squares(g.data(), 32);
  t = take_phase_totals();
  EXPECT_EQ(t.calls_of(Phase::attention), 1);
  EXPECT_EQ(t.calls_of(Phase::norms_elementwise), 2);
  EXPECT_EQ(t.calls_of(Phase::optimizer), 2);
  EXPECT_EQ(t.calls_of(Phase::gemm), 0);
}
