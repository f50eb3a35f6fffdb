// plan's decision on the decision cases: everything fits (ddp), only zero3 fits,
// nothing fits (and the smallest change that would), and a slow link between nodes
// that makes hybrid sharding, or ddp given more memory, beat zero3. Budgets are set
// from the plans' own byte counts (which plan_matches_measurement.sh checks against
// real runs), so each case is the situation its name says.
#include <gtest/gtest.h>

#include <limits>

#include "shardlm/plan/recommend.hpp"

using namespace shardlm;

namespace {

RunPlanRequest request(const std::string& model, int n, DType precision) {
  RunPlanRequest r;
  r.config = model_preset(model);
  r.world_size = n;
  r.micro_batch = 4;
  r.seq_len = 256;
  r.model.precision = precision;
  r.strategy.param_dtype = precision;
  return r;
}

const Candidate& find(const std::vector<Candidate>& c, const std::string& label) {
  for (const auto& x : c)
    if (x.label == label) return x;
  throw std::runtime_error("no candidate " + label);
}

double total(const std::vector<Candidate>& c, const std::string& label) {
  return static_cast<double>(find(c, label).plan.total());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(Recommend, WhenEverythingFitsDdpMovesTheFewestBytes) {
  const auto base = request("gpt2-small-30m", 2, DType::fp32);
  const auto c = plan_candidates(base, nullptr, {}, false);
  const auto rec = recommend(c, 64.0 * (1ll << 30), base, nullptr, {});
  ASSERT_TRUE(rec.chosen);
  EXPECT_EQ(c[*rec.chosen].label, "ddp");
  EXPECT_TRUE(contains(rec.explanation, "ddp: fits with")) << rec.explanation;
  EXPECT_TRUE(contains(rec.explanation, "moves the fewest bytes")) << rec.explanation;
  // No budget at all: the same choice.
  const auto unbounded =
      recommend(c, std::numeric_limits<double>::infinity(), base, nullptr, {});
  EXPECT_EQ(c[*unbounded.chosen].label, "ddp");
}

TEST(Recommend, WhenOnlyZero3FitsItIsChosen) {
  const auto base = request("gpt2", 4, DType::fp32);
  const auto c = plan_candidates(base, nullptr, {}, false);
  double others = std::numeric_limits<double>::infinity();
  for (const auto& x : c)
    if (x.label != "zero3") others = std::min(others, static_cast<double>(x.plan.total()));
  ASSERT_LT(total(c, "zero3"), others);
  const auto rec = recommend(c, total(c, "zero3"), base, nullptr, {});
  ASSERT_TRUE(rec.chosen);
  EXPECT_EQ(c[*rec.chosen].label, "zero3");
  EXPECT_TRUE(contains(rec.explanation, "zero3: the only candidate that fits")) << rec.explanation;
  EXPECT_EQ(candidate_flags(c[*rec.chosen]), "--strategy zero3");
}

TEST(Recommend, WhenNothingFitsItNamesTheSmallestChangeThatDoes) {
  const auto base = request("gpt2", 2, DType::fp32);
  const auto c = plan_candidates(base, nullptr, {}, false);
  RunPlanRequest ckpt = base;
  ckpt.model.activation_checkpointing = true;
  const auto with_ckpt = plan_candidates(ckpt, nullptr, {}, false);
  // Between zero3 with and without checkpointing: only the change makes it fit.
  const double budget = total(with_ckpt, "zero3") + 1;
  ASSERT_LT(budget, total(c, "zero3"));
  const auto rec = recommend(c, budget, base, nullptr, {});
  EXPECT_FALSE(rec.chosen);
  EXPECT_TRUE(contains(rec.explanation, "nothing fits in")) << rec.explanation;
  EXPECT_TRUE(contains(rec.explanation, "the smallest change that fits is --activation-checkpointing (zero3"))
      << rec.explanation;
  // A budget below even one parameter per rank at 4096 ranks: nothing helps.
  const auto hopeless = recommend(c, 1024, base, nullptr, {});
  EXPECT_FALSE(hopeless.chosen);
  EXPECT_TRUE(contains(hopeless.explanation, "no change tried fits")) << hopeless.explanation;
}

TEST(Recommend, TheChangeIsJudgedLikeTheCandidatesAndNamesOnlyNewFlags) {
  // A bf16 run at micro-batch 1, candidates with and without checkpointing: only more
  // ranks fit (with checkpointing), and the advice names the fewest ranks that do and
  // the candidate, without repeating --precision bf16 --micro-batch 1.
  auto base = request("gpt2", 2, DType::bf16);
  base.micro_batch = 1;
  base.seq_len = 1024;
  const auto c = plan_candidates(base, nullptr, {}, true);
  auto wider = base;
  wider.world_size = 4;
  const auto at4 = plan_candidates(wider, nullptr, {}, true);
  const double budget = total(at4, "zero3 + ckpt") + 1;
  ASSERT_LT(budget, total(at4, "zero3"));
  ASSERT_LT(budget, total(c, "zero3 + ckpt"));
  const auto rec = recommend(c, budget, base, nullptr, {});
  EXPECT_FALSE(rec.chosen);
  EXPECT_TRUE(contains(rec.explanation, "the smallest change that fits is -n 4 (zero3 + ckpt:"))
      << rec.explanation;
  EXPECT_FALSE(contains(rec.explanation, "--precision")) << rec.explanation;
  EXPECT_FALSE(contains(rec.explanation, "--micro-batch")) << rec.explanation;
}

TEST(Recommend, ASlowLinkBetweenNodesMakesHybridBeatZero3) {
  // gpt2 in bf16 on 2 nodes x 8 H100s: budget too small for ddp, enough for zero3
  // and hybrid. Over 1 Gbit/s between nodes zero3 sends ~3 Psi through each node's
  // link per step, hybrid with groups of 8 only the replica all-reduce.
  const auto base = request("gpt2", 16, DType::bf16);
  const HardwareProfile h100 = builtin_profile("h100-80g");
  const ClusterShape slow{2, "1gbit"};
  const auto c = plan_candidates(base, &h100, slow, false);
  const double budget = total(c, "zero2") - 1;  // ddp, zero1 and zero2 do not fit
  ASSERT_LT(total(c, "hybrid 8"), budget);
  ASSERT_LT(total(c, "zero3"), budget);
  const auto rec = recommend(c, budget, base, &h100, slow);
  ASSERT_TRUE(rec.chosen);
  EXPECT_EQ(c[*rec.chosen].label, "hybrid 8") << rec.explanation;
  // The link is the bottleneck: hybrid sends 4 bytes per parameter through it (8
  // replica all-reduces of Psi/8 fp32 each), zero3 (2 + 2 + 4) x 15/16 = 7.5.
  EXPECT_NEAR(find(c, "hybrid 8").time->step_s / find(c, "zero3").time->step_s, 4 / 7.5, 0.03);
  EXPECT_TRUE(contains(rec.explanation, "predicted")) << rec.explanation;
}

TEST(Recommend, ASlowLinkMakesDdpWorthItsMemoryAndSaysSo) {
  // 2 nodes x 1 rank over 1 Gbit/s, fp32: zero3 moves 12 bytes per parameter, ddp 8.
  // (gpt2-medium: its tied embedding is a small part, so zero3 needs the least memory.)
  const auto base = request("gpt2-medium", 2, DType::fp32);
  const HardwareProfile h100 = builtin_profile("h100-80g");
  const ClusterShape slow{2, "1gbit"};
  const auto c = plan_candidates(base, &h100, slow, false);
  ASSERT_LT(find(c, "ddp").time->step_s, find(c, "zero3").time->step_s);
  const auto roomy = recommend(c, total(c, "ddp"), base, &h100, slow);
  EXPECT_EQ(c[*roomy.chosen].label, "ddp") << roomy.explanation;
  // With memory for zero3 only, the line says what more memory would buy: zero2
  // sends ddp's 8 bytes per parameter and is the candidate needing the least memory
  // of those that do.
  ASSERT_LT(total(c, "zero2"), total(c, "zero1"));
  ASSERT_LT(total(c, "zero2"), total(c, "zero3 no-reshard"));
  const auto tight = recommend(c, total(c, "zero3"), base, &h100, slow);
  EXPECT_EQ(c[*tight.chosen].label, "zero3") << tight.explanation;
  EXPECT_TRUE(contains(tight.explanation, "zero2 would take")) << tight.explanation;
}
