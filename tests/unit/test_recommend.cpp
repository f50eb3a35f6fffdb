// plan's decision on the decision cases: everything fits (ddp), only zero3 fits,
// nothing fits (and the smallest change that would), and a slow link between nodes
// that makes hybrid sharding, or ddp given more memory, beat zero3. Budgets are set
// from the plans' own byte counts (which plan_matches_measurement.sh checks against
// real runs), so each case is the situation its name says. --strategy auto's layouts
// (AutoLayouts): each context-parallel size with the kind its heads allow (ring, hybrid),
// and a mixture of experts at each expert-parallel size.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/model/param_layout.hpp"
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

namespace {

// A candidate with only what step 3 reads: memory, bytes on the wire, a step time.
Candidate timed(const std::string& label, double step_s, double wire_bytes) {
  Candidate c;
  c.label = label;
  c.request.strategy.kind = parse_strategy_kind(label);
  c.plan.params = 1 << 20;
  c.plan.wire_bytes_per_step = wire_bytes;
  c.plan.tokens_per_step = 1000;
  c.time = StepTimePrediction{};
  c.time->step_s = step_s;
  c.time->tokens_per_s = 1000 / step_s;
  return c;
}

}  // namespace

TEST(Recommend, NeverPicksACandidateThatAnotherCandidateThatFitsBeats) {
  // zero1 predicted 1.5% faster than ddp at the same bytes: the faster wins, however
  // simple ddp is (the rule this replaces kept ddp within 2%), and the line's
  // runner-up is not faster than the choice.
  const std::vector<Candidate> close = {timed("ddp", 1.00, 100), timed("zero1", 0.985, 100),
                                        timed("zero3", 0.99, 150)};
  const auto rec = recommend(close, 1e12, {}, nullptr, {});
  ASSERT_TRUE(rec.chosen);
  EXPECT_EQ(close[*rec.chosen].label, "zero1") << rec.explanation;
  EXPECT_TRUE(contains(rec.explanation, "next zero3 at 990 ms")) << rec.explanation;
  // Predicted equally fast (within 1%): fewer bytes, then the simpler (earlier)
  // candidate, and the line says the other is as fast.
  const std::vector<Candidate> tied = {timed("ddp", 1.0, 100), timed("zero1", 0.992, 100),
                                       timed("zero3", 1.0, 90)};
  EXPECT_EQ(tied[*recommend(tied, 1e12, {}, nullptr, {}).chosen].label, "zero3");
  const std::vector<Candidate> same_bytes = {timed("ddp", 1.0, 100), timed("zero1", 0.992, 100)};
  const auto simpler = recommend(same_bytes, 1e12, {}, nullptr, {});
  EXPECT_EQ(same_bytes[*simpler.chosen].label, "ddp");
  EXPECT_TRUE(contains(simpler.explanation, "as fast as zero1 (992.00 ms against 1000.00: within 1.0%"))
      << simpler.explanation;
  // Just outside the resolution the faster wins.
  const std::vector<Candidate> apart = {timed("ddp", 1.0, 100), timed("zero1", 0.989, 100)};
  EXPECT_EQ(apart[*recommend(apart, 1e12, {}, nullptr, {}).chosen].label, "zero1");
  // A faster candidate that does not fit does not count.
  std::vector<Candidate> big = {timed("ddp", 1.0, 100), timed("zero1", 0.5, 100)};
  big[1].plan.params = 1 << 30;
  EXPECT_EQ(big[*recommend(big, 1 << 25, {}, nullptr, {}).chosen].label, "ddp");
}

TEST(Recommend, TheChoiceIsTheFastestThatFitsOnEveryPlannedCase) {
  // The real candidate sets of the cases above and of adapters: no eligible candidate
  // is predicted faster than the one chosen by more than the model's resolution
  // (1%), and the line never names a faster runner-up as "next".
  struct Case {
    std::string model;
    int n;
    DType precision;
    int lora_rank;
    const char* profile;
    ClusterShape cluster;
  };
  const Case cases[] = {
      {"gpt2", 16, DType::bf16, 0, "h100-80g", {2, "1gbit"}},
      {"gpt2-medium", 2, DType::fp32, 0, "h100-80g", {2, "1gbit"}},
      {"qwen2.5-0.5b", 4, DType::bf16, 8, "a100-80g", {}},
      {"qwen3-8b", 4, DType::bf16, 8, "a100-80g", {}},
      {"qwen3-8b", 4, DType::bf16, 0, "a100-80g", {}},
  };
  for (const Case& k : cases) {
    auto base = request(k.model, k.n, k.precision);
    base.config.lora.rank = k.lora_rank;
    if (k.lora_rank > 0) base.config.lora.targets = {"q_proj", "v_proj"};
    const HardwareProfile profile = builtin_profile(k.profile);
    const auto c = plan_candidates(base, &profile, k.cluster, true);
    const auto rec = recommend(c, profile.memory_per_rank_bytes, base, &profile, k.cluster);
    ASSERT_TRUE(rec.chosen) << k.model << ": " << rec.explanation;
    for (const auto& x : c) {
      if (static_cast<double>(x.plan.total()) > profile.memory_per_rank_bytes) continue;
      EXPECT_GE(x.time->step_s * 1.01, c[*rec.chosen].time->step_s)
          << k.model << ": " << x.label << " beats " << c[*rec.chosen].label;
    }
    const std::string next = ", next ";
    const size_t at = rec.explanation.find(next);
    if (at != std::string::npos) {
      const std::string runner_up = rec.explanation.substr(at + next.size(),
                                                           rec.explanation.find(" at ", at) - at - next.size());
      EXPECT_GE(find(c, runner_up).time->step_s, c[*rec.chosen].time->step_s) << rec.explanation;
    }
  }
}

TEST(Recommend, ALoraRunWithAFewHundredMiBOfStatePicksDdp) {
  // LoRA r = 8 on every linear layer, bf16, on A100s: the adapters' gradients and
  // AdamW state are tens (qwen2.5-0.5b) to hundreds (qwen3-8b) of MiB next to a frozen
  // base of GiBs, so sharding saves nothing worth a byte, and ddp is chosen: predicted
  // fastest (qwen3-8b: its gradient buckets overlap backward, zero1/zero2 wait for
  // their parameter all-gathers), or as fast within the model's 1% and simpler
  // (qwen2.5-0.5b: zero2 hides the one late bucket of its few MiB of gradients).
  struct Case {
    std::string model;
    int n, micro_batch, seq_len;
    double min_state_mib, max_state_mib;
  };
  const Case cases[] = {{"qwen2.5-0.5b", 2, 1, 1024, 10, 300},
                        {"qwen2.5-0.5b", 4, 1, 1024, 10, 300},
                        {"qwen3-8b", 4, 1, 4096, 100, 1024},
                        {"qwen3-8b", 4, 1, 32768, 100, 1024}};
  const HardwareProfile a100 = builtin_profile("a100-80g");
  for (const Case& k : cases) {
    const std::string name = k.model + " n=" + std::to_string(k.n) + " T=" + std::to_string(k.seq_len);
    auto base = request(k.model, k.n, DType::bf16);
    base.micro_batch = k.micro_batch;
    base.seq_len = k.seq_len;
    base.config.lora.rank = 8;
    base.config.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj",
                                "gate_proj", "up_proj", "down_proj"};
    const auto c = plan_candidates(base, &a100, {}, true);
    const Candidate& ddp = find(c, "ddp");
    const double state_mib = static_cast<double>(ddp.plan.grads + ddp.plan.optimizer) / (1 << 20);
    EXPECT_GT(state_mib, k.min_state_mib) << name;
    EXPECT_LT(state_mib, k.max_state_mib) << name;
    const auto rec = recommend(c, a100.memory_per_rank_bytes, base, &a100, {});
    ASSERT_TRUE(rec.chosen) << name << ": " << rec.explanation;
    // (At 32K tokens the activations need checkpointing: "ddp + ckpt".)
    EXPECT_EQ(c[*rec.chosen].request.strategy.kind, StrategyKind::ddp) << name << ": " << rec.explanation;
    // And without a profile (fewest bytes, then the simplest): ddp as well.
    const auto untimed = plan_candidates(base, nullptr, {}, true);
    const auto by_bytes = recommend(untimed, a100.memory_per_rank_bytes, base, nullptr, {});
    ASSERT_TRUE(by_bytes.chosen) << name;
    EXPECT_EQ(untimed[*by_bytes.chosen].request.strategy.kind, StrategyKind::ddp) << name;
  }
}

// The host side of a device run, by hand: 4 ranks on a node, each holding 263 GiB in
// host memory, need 1052 GiB of the node's; 1024 GiB does not hold them, 1052 does.
TEST(MemoryBudget, TheHostSideOfTheRanksOnANodeMustFitItsHostMemory) {
  constexpr double GiB = double(1ll << 30);
  RunPlan p;
  p.params = static_cast<int64_t>(50 * GiB);  // the device side: 50 GiB
  p.host.params = static_cast<int64_t>(65 * GiB);
  p.host.grads = static_cast<int64_t>(68 * GiB);
  p.host.optimizer = static_cast<int64_t>(130 * GiB);
  ASSERT_EQ(p.host.total(), static_cast<int64_t>(263 * GiB));
  MemoryBudget budget(80 * GiB);
  EXPECT_TRUE(budget.fits(p));  // host memory unknown: not checked
  budget.ranks_per_node = 4;
  budget.host_per_node = 1024 * GiB;
  EXPECT_EQ(budget.host_per_node_of(p), 1052 * GiB);
  EXPECT_TRUE(budget.fits_device(p));
  EXPECT_FALSE(budget.fits_host(p));
  EXPECT_FALSE(budget.fits(p));
  budget.host_per_node = 1052 * GiB;
  EXPECT_TRUE(budget.fits(p));
  budget.ranks_per_node = 5;  // a fifth rank on the node: 1315 GiB
  EXPECT_FALSE(budget.fits(p));
  budget.ranks_per_node = 4;
  budget.per_rank = 49 * GiB;  // and the device side on its own
  EXPECT_FALSE(budget.fits(p));
}

// An offloaded run: the host holds 16 bytes per owned trainable element (fp32 master,
// m, v, the gradient's accumulation) plus a staging slice of the largest owned unit,
// and the device the parameters in bf16 and two transient fp32 unit gradients. A node
// whose host memory holds the smallest host side but one byte less than the next is
// what decides; one byte less than the smallest, nothing fits, and the line names the
// host.
TEST(Recommend, AnOffloadedCandidateWhoseHostSideDoesNotFitIsNotChosen) {
  auto base = request("gpt2", 4, DType::bf16);
  base.model.device = Device{DeviceKind::cuda, 0};
  base.strategy.optimizer_on_host = true;
  const auto c = plan_candidates(base, nullptr, {}, false);
  // By hand from the layout: ddp owns whole units, the others 1/4 of each.
  const ParamLayout layout = ParamLayout::build(base.config, 4, base.min_unit_params);
  int64_t whole = 0, largest = 0, largest_private = 0;
  for (const auto& u : layout.units) {
    whole += u.padded_numel;
    largest = std::max(largest, u.padded_numel);
  }
  for (size_t u = 1; u < layout.units.size(); ++u)  // the embeddings (unit 0) are shared
    largest_private = std::max(largest_private, layout.units[u].padded_numel);
  const RunPlan& ddp = find(c, "ddp").plan;
  const RunPlan& zero3 = find(c, "zero3").plan;
  EXPECT_EQ(ddp.host.params, 4 * whole);
  EXPECT_EQ(ddp.host.optimizer, 8 * whole);
  EXPECT_EQ(ddp.host.grads, 4 * whole + 4 * largest);
  EXPECT_EQ(zero3.host.params, whole);
  EXPECT_EQ(zero3.host.optimizer, 2 * whole);
  EXPECT_EQ(zero3.host.grads, whole + largest);
  EXPECT_EQ(ddp.optimizer, 0);
  // ddp's device side: every unit in bf16, two transient fp32 gradients of the largest
  // private unit and the shared embeddings' dedicated fp32 gradient.
  EXPECT_EQ(ddp.grads, 2 * 4 * largest_private + 4 * layout.units[0].padded_numel);
  EXPECT_GE(ddp.params, 2 * whole);
  EXPECT_LT(ddp.params, 2 * whole + (int64_t{64} << 20));  // plus the model's vector scratch

  MemoryBudget budget(1e15);  // the device side fits; 2 ranks on a node
  budget.ranks_per_node = 2;
  budget.host_per_node = 2.0 * static_cast<double>(zero3.host.total());
  auto rec = recommend(c, budget, base, nullptr, {});
  ASSERT_TRUE(rec.chosen) << rec.explanation;
  EXPECT_NE(c[*rec.chosen].request.strategy.kind, StrategyKind::ddp) << rec.explanation;
  EXPECT_LE(c[*rec.chosen].plan.host.total(), zero3.host.total()) << rec.explanation;
  EXPECT_TRUE(contains(rec.explanation, "host")) << rec.explanation;
  budget.host_per_node -= 1;
  rec = recommend(c, budget, base, nullptr, {});
  EXPECT_FALSE(rec.chosen) << rec.explanation;
  EXPECT_TRUE(contains(rec.explanation, "nothing fits in host memory")) << rec.explanation;
  EXPECT_TRUE(contains(rec.explanation, "2 ranks x")) << rec.explanation;
}

// --strategy auto's layouts beyond tensor parallelism: each context-parallel size runs
// the kind the heads allow, and a mixture of experts is planned at each expert-parallel
// size too.
namespace {

RunPlanRequest long_rows(const std::string& model, int n) {
  RunPlanRequest r = request(model, n, DType::bf16);
  r.micro_batch = 1;
  r.seq_len = 1024;
  return r;
}

}  // namespace

TEST(AutoLayouts, EachContextSizeRunsTheKindItsHeadsAllow) {
  // llama-tiny: 4 query heads, 2 key/value heads. Ulysses splits the 4 heads over 2 and 4
  // ranks (the key/value heads replicated at 4); 8 ranks get Ulysses inside groups of 4
  // and the ring across the 2 groups.
  const RunPlanRequest llama = long_rows("llama-tiny", 8);
  const auto kind = [](const std::optional<ContextLayout>& l) {
    return l ? fmt::format("{} u{}", context_parallel_kind_name(l->kind), l->ulysses_degree) : "none";
  };
  EXPECT_EQ(kind(context_layout(llama, 2, 1)), "ulysses u1");
  EXPECT_EQ(kind(context_layout(llama, 4, 1)), "ulysses u1");
  EXPECT_EQ(kind(context_layout(llama, 8, 1)), "hybrid u4");
  // At T = 2 a tensor rank has 2 query heads and 1 key/value head: Ulysses over 2, then
  // hybrid with groups of 2.
  EXPECT_EQ(kind(context_layout(llama, 2, 2)), "ulysses u1");
  EXPECT_EQ(kind(context_layout(llama, 4, 2)), "hybrid u2");
  // qwen3-tiny's 3 heads split over neither 2 nor 4 ranks: only the ring keeps them whole.
  const RunPlanRequest qwen3 = long_rows("qwen3-tiny", 4);
  EXPECT_EQ(kind(context_layout(qwen3, 2, 1)), "ring u1");
  EXPECT_EQ(kind(context_layout(qwen3, 4, 1)), "ring u1");
  // A run that names ring keeps it; a sequence the zigzag split does not divide has none.
  RunPlanRequest ring = llama;
  ring.model.context_parallel_kind = ContextParallelKind::ring;
  EXPECT_EQ(kind(context_layout(ring, 2, 1)), "ring u1");
  ring.seq_len = 1026;  // not a multiple of 2P = 8
  EXPECT_EQ(kind(context_layout(ring, 4, 1)), "none");
  // Before, 8 context ranks of llama-tiny were left out (Ulysses alone); now hybrid runs them.
  EXPECT_EQ(context_parallel_choices(llama, ClusterShape{1, ""}), (std::vector<int>{2, 4, 8}));
  EXPECT_EQ(context_parallel_choices(qwen3, ClusterShape{1, ""}), (std::vector<int>{2, 4}));
}

TEST(AutoLayouts, AContextSizeThatNeedsTheRingIsPlannedAndNamedWithIt) {
  // qwen3-tiny at 1024 tokens on 2 ranks: a budget nothing fits without splitting the
  // sequence; P = 2 must run the ring (3 heads), and the flags say so.
  const RunPlanRequest base = long_rows("qwen3-tiny", 2);
  const ClusterShape one_node{1, ""};
  const auto whole = plan_candidates(base, nullptr, one_node, true, tensor_parallel_choices(base, one_node));
  double least = std::numeric_limits<double>::infinity();
  for (const Candidate& c : whole) least = std::min(least, static_cast<double>(c.plan.total()));
  const AutoSearch search = auto_search(base, nullptr, one_node, MemoryBudget(least - 1));
  ASSERT_TRUE(search.recommendation.chosen) << search.recommendation.explanation;
  const Candidate& c = search.candidates[*search.recommendation.chosen];
  EXPECT_EQ(c.request.strategy.context_parallel, 2) << c.label;
  EXPECT_EQ(c.request.model.context_parallel_kind, ContextParallelKind::ring) << c.label;
  EXPECT_TRUE(contains(c.label, " x cp2 ring")) << c.label;
  EXPECT_TRUE(contains(candidate_flags(c), "--context-parallel 2 --context-parallel-kind ring"))
      << candidate_flags(c);
  // The ring's send_recvs are in the planned step (it ran the ring, not Ulysses).
  bool ring = false;
  for (const PlannedCollective& k : c.plan.program.collectives)
    ring = ring || k.kind == CollectiveKind::send_recv;
  EXPECT_TRUE(ring);
}

TEST(AutoLayouts, AMixtureOfExpertsIsPlannedAtEachExpertParallelSize) {
  // qwen3-moe-tiny: 8 experts per sparse layer.
  RunPlanRequest moe = request("qwen3-moe-tiny", 4, DType::bf16);
  EXPECT_EQ(expert_parallel_choices(moe), (std::vector<int>{1, 2, 4}));
  moe.world_size = 16;
  EXPECT_EQ(expert_parallel_choices(moe), (std::vector<int>{1, 2, 4, 8}));
  moe.world_size = 4;
  RunPlanRequest asked = moe;
  asked.strategy.expert_parallel = 2;  // named: kept
  EXPECT_EQ(expert_parallel_choices(asked), (std::vector<int>{2}));
  RunPlanRequest ckpt = moe;  // checkpointing combines with every E
  ckpt.model.activation_checkpointing = true;
  EXPECT_EQ(expert_parallel_choices(ckpt), (std::vector<int>{1, 2, 4}));
  RunPlanRequest split = moe;  // E divides the data-parallel ranks (4 / P = 2), or spans
  split.strategy.context_parallel = 2;  // them and the context ranks: 4 = 2 x P
  EXPECT_EQ(expert_parallel_choices(split), (std::vector<int>{1, 2, 4}));
  split.strategy.context_parallel = 4;  // 1 data-parallel rank: 2 is no multiple of P
  EXPECT_EQ(expert_parallel_choices(split), (std::vector<int>{1, 4}));
  RunPlanRequest offloaded = moe;  // the offloaded optimizer holds a rank's experts
  offloaded.strategy.optimizer_on_host = true;
  EXPECT_EQ(expert_parallel_choices(offloaded), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(expert_parallel_choices(request("llama-tiny", 4, DType::bf16)), (std::vector<int>{1}));

  // The search: every strategy at E = 2 and 4, with and without checkpointing; hybrid
  // only with shard groups E divides (groups of 2 at E = 2; E = 4 has none).
  const AutoSearch search = auto_search(moe, nullptr, ClusterShape{1, ""}, MemoryBudget());
  int spread = 0, hybrid = 0, checkpointed = 0;
  for (const Candidate& c : search.candidates) {
    if (c.request.strategy.expert_parallel == 1) continue;
    ++spread;
    const StrategyOptions& s = c.request.strategy;
    if (s.kind == StrategyKind::hybrid) {
      ++hybrid;
      EXPECT_EQ(s.shard_group_size % s.expert_parallel, 0) << c.label;
      EXPECT_TRUE(contains(candidate_flags(c), fmt::format("--shard-group-size {}", s.shard_group_size)))
          << candidate_flags(c);
    }
    if (c.request.model.activation_checkpointing) {
      ++checkpointed;
      EXPECT_TRUE(contains(c.label, " + ckpt")) << c.label;
      EXPECT_TRUE(contains(candidate_flags(c), "--activation-checkpointing")) << candidate_flags(c);
    }
    EXPECT_EQ(c.plan.expert_parallel, s.expert_parallel) << c.label;
    EXPECT_TRUE(contains(c.label, fmt::format(" x ep{}", c.plan.expert_parallel))) << c.label;
    EXPECT_TRUE(contains(candidate_flags(c), fmt::format("--expert-parallel {}", c.plan.expert_parallel)))
        << candidate_flags(c);
  }
  // ddp, zero1, zero2, zero3, zero3 no-reshard at E = 2 and 4, hybrid 2 at E = 2; each
  // with and without checkpointing.
  EXPECT_EQ(spread, 2 * (2 * 5 + 1));
  EXPECT_EQ(hybrid, 2);
  EXPECT_EQ(checkpointed, spread / 2);
  // Without a profile the fewest bytes win. ddp x ep4 all-reduces only the dense units'
  // gradients (each expert's live on one rank) and exchanges the tokens.
  ASSERT_TRUE(search.recommendation.chosen);
  const Candidate& chosen = search.candidates[*search.recommendation.chosen];
  for (const Candidate& c : search.candidates)
    EXPECT_LE(chosen.plan.wire_bytes_per_step, c.plan.wire_bytes_per_step) << c.label;
}

// --strategy auto tries expert parallelism with checkpointing, hybrid and context
// parallelism (wherever the mesh lays it out) and chooses among them by the same rule:
// what fits, then the predicted step time. Each case's budget comes from the plans'
// own totals; the chosen candidate's bytes and step time are a direct plan of its
// layout's.
namespace {

RunPlanRequest moe_on_gpus(const std::string& model, int n_layer, int n, int seq_len) {
  RunPlanRequest r = request(model, n, DType::bf16);
  r.config.n_layer = n_layer;
  r.micro_batch = 1;
  r.seq_len = seq_len;
  r.model.device = Device{DeviceKind::cuda, 0};
  return r;
}

// The chosen candidate is what plan_run and predict_step_time give its request, and no
// candidate that fits is predicted faster (beyond the model's 1%).
void expect_planned_and_fastest(const std::vector<Candidate>& c, size_t chosen, const MemoryBudget& budget,
                                const HardwareProfile& profile, const ClusterShape& cluster) {
  const Candidate& x = c[chosen];
  const RunPlan direct = plan_run(x.request);
  EXPECT_EQ(direct.total(), x.plan.total()) << x.label;
  EXPECT_EQ(direct.activations, x.plan.activations) << x.label;
  EXPECT_EQ(direct.wire_bytes_per_step, x.plan.wire_bytes_per_step) << x.label;
  ASSERT_TRUE(x.time);
  EXPECT_EQ(predict_step_time(direct, profile, cluster).step_s, x.time->step_s) << x.label;
  for (const Candidate& o : c) {
    if (budget.fits(o.plan)) {
      EXPECT_GE(o.time->step_s * 1.01, x.time->step_s) << o.label << " beats " << x.label;
    }
  }
}

}  // namespace

TEST(AutoExperts, ActivationsThatFitOnlyCheckpointedMakeExpertParallelismWithCheckpointingTheChoice) {
  // Four of qwen3-30b-a3b's 48 layers (128 experts of 768, top-8) at 8192 tokens on 2
  // nodes x 8 H100s. The experts' receive buffers make every E > 1 layout need more
  // than the budget (the least of them, less a byte) unless it checkpoints; E = 4 with
  // checkpointing is then predicted faster than every E = 1 layout that fits, because
  // zero3 gathers and reduce-scatters every expert across the nodes and E > 1 only its
  // own experts' slices.
  const RunPlanRequest base = moe_on_gpus("qwen3-30b-a3b", 4, 16, 8192);
  const HardwareProfile h100 = builtin_profile("h100-80g");
  const ClusterShape cluster{2, ""};
  const AutoSearch all = auto_search(base, &h100, cluster, MemoryBudget());
  double least_spread = std::numeric_limits<double>::infinity();
  for (const Candidate& c : all.candidates)
    if (c.request.strategy.expert_parallel > 1 && !c.request.model.activation_checkpointing)
      least_spread = std::min(least_spread, static_cast<double>(c.plan.total()));
  const MemoryBudget budget(least_spread - 1);
  const Recommendation rec = recommend(all.candidates, budget, base, &h100, cluster);
  ASSERT_TRUE(rec.chosen) << rec.explanation;
  const Candidate& x = all.candidates[*rec.chosen];
  EXPECT_GT(x.request.strategy.expert_parallel, 1) << rec.explanation;
  EXPECT_TRUE(x.request.model.activation_checkpointing) << rec.explanation;
  EXPECT_TRUE(contains(candidate_flags(x), "--activation-checkpointing")) << candidate_flags(x);
  expect_planned_and_fastest(all.candidates, *rec.chosen, budget, h100, cluster);
  // Without expert parallelism it would be slower by more than the model's resolution.
  bool e1_fits = false;
  for (const Candidate& c : all.candidates)
    if (c.request.strategy.expert_parallel == 1 && budget.fits(c.plan)) {
      e1_fits = true;
      EXPECT_GT(c.time->step_s, 1.01 * x.time->step_s) << c.label;
    }
  EXPECT_TRUE(e1_fits);
}

TEST(AutoExperts, ASlowLinkMakesHybridWithExpertParallelismTheChoice) {
  // Two of qwen1.5-moe-a2.7b's layers (60 experts: E = 2 or 4) at 2048 tokens on 2
  // nodes x 8 H100s over 1 Gbit/s: hybrid 8 keeps the gathers inside each node (only
  // the replicas' all-reduce crosses the link, as for dense models), and spreading
  // the experts over 4 ranks of each shard group is predicted fastest of all and
  // moves the fewest bytes of the hybrid layouts.
  const RunPlanRequest base = moe_on_gpus("qwen1.5-moe-a2.7b", 2, 16, 2048);
  const HardwareProfile h100 = builtin_profile("h100-80g");
  const ClusterShape slow{2, "1gbit"};
  const MemoryBudget budget(h100.memory_per_rank_bytes);
  const AutoSearch search = auto_search(base, &h100, slow, budget);
  ASSERT_TRUE(search.recommendation.chosen) << search.recommendation.explanation;
  const Candidate& x = search.candidates[*search.recommendation.chosen];
  EXPECT_EQ(x.request.strategy.kind, StrategyKind::hybrid) << search.recommendation.explanation;
  EXPECT_GT(x.request.strategy.expert_parallel, 1) << search.recommendation.explanation;
  EXPECT_TRUE(contains(candidate_flags(x), fmt::format("--strategy hybrid --shard-group-size {} --expert-parallel {}",
                                                       x.request.strategy.shard_group_size,
                                                       x.request.strategy.expert_parallel)))
      << candidate_flags(x);
  expect_planned_and_fastest(search.candidates, *search.recommendation.chosen, budget, h100, slow);
  // Every layout that is not hybrid is slower beyond the resolution, and the same
  // hybrid at E = 1 moves more bytes.
  for (const Candidate& c : search.candidates) {
    if (!budget.fits(c.plan)) continue;
    if (c.request.strategy.kind != StrategyKind::hybrid) {
      EXPECT_GT(c.time->step_s, 1.01 * x.time->step_s) << c.label;
    } else if (c.request.strategy.expert_parallel == 1 &&
               c.request.strategy.shard_group_size == x.request.strategy.shard_group_size &&
               c.request.model.activation_checkpointing == x.request.model.activation_checkpointing) {
      EXPECT_GT(c.plan.wire_bytes_per_step, x.plan.wire_bytes_per_step) << c.label;
    }
  }
}

TEST(AutoExperts, ExpertParallelismIsTriedWithTheContextSizesWhenNothingFitsWhole) {
  // qwen3-moe-tiny at 1024 tokens on 4 ranks: a budget below every whole-row layout
  // (any E, with or without checkpointing) makes auto split the sequence, and the
  // split candidates include E = 2 at P = 2 (E divides the 2 data-parallel ranks)
  // and E = 4 there (the expert group spans the context ranks), none that does neither.
  RunPlanRequest base = request("qwen3-moe-tiny", 4, DType::bf16);
  base.micro_batch = 1;
  base.seq_len = 1024;
  const ClusterShape one_node{1, ""};
  const auto whole = plan_candidates(base, nullptr, one_node, true, tensor_parallel_choices(base, one_node), {},
                                     expert_parallel_choices(base));
  double least = std::numeric_limits<double>::infinity();
  for (const Candidate& c : whole) least = std::min(least, static_cast<double>(c.plan.total()));
  const AutoSearch search = auto_search(base, nullptr, one_node, MemoryBudget(least - 1));
  ASSERT_TRUE(search.recommendation.chosen) << search.recommendation.explanation;
  EXPECT_GT(search.candidates[*search.recommendation.chosen].request.strategy.context_parallel, 1);
  bool ep_with_cp = false, ep_over_cp = false;
  for (const Candidate& c : search.candidates) {
    const StrategyOptions& s = c.request.strategy;
    if (s.context_parallel == 1) continue;
    const int data = base.world_size / s.context_parallel;
    EXPECT_TRUE(data % s.expert_parallel == 0 || s.expert_parallel % s.context_parallel == 0) << c.label;
    EXPECT_EQ(c.plan.expert_spans_context, data % s.expert_parallel != 0) << c.label;
    ep_over_cp = ep_over_cp || data % s.expert_parallel != 0;
    if (s.expert_parallel > 1) {
      ep_with_cp = true;
      EXPECT_TRUE(contains(c.label, fmt::format(" x ep{} x cp{}", s.expert_parallel, s.context_parallel))) << c.label;
      EXPECT_EQ(plan_run(c.request).total(), c.plan.total()) << c.label;
    }
  }
  EXPECT_TRUE(ep_with_cp);
  EXPECT_TRUE(ep_over_cp);
}
