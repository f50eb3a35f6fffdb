// plan under tensor parallelism: the traced step runs the tensor-parallel model (each
// rank's pieces of the split matrices), so a tensor rank multiplies 1/T of the split
// GEMMs (the vocabulary-parallel head's too) and runs the whole norms; the tensor
// group's all-reduces (two per layer forward, two backward, each a [tokens, n_embd]
// fp32 partial sum, and the vocabulary-parallel embedding's and head's) are on the wire; and the time model keeps the tensor group on the innermost ranks, inside a
// node, with the other groups' ranks T apart. With sequence parallelism the norms run
// on a rank's 1/T of the tokens.
#include <gtest/gtest.h>

#include "shardlm/model/param_layout.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/plan/recommend.hpp"
#include "shardlm/plan/time_model.hpp"

#include <fmt/format.h>

#include <limits>
#include <map>

using namespace shardlm;

namespace {

RunPlanRequest tiny(int world_size, int tensor_parallel) {
  RunPlanRequest r;
  r.config = model_preset("llama-tiny");  // 3 layers, 4 heads, 2 key/value heads
  r.micro_batch = 2;
  r.seq_len = 64;
  r.global_batch = 2 * world_size / tensor_parallel;
  r.world_size = world_size;
  r.strategy.tensor_parallel = tensor_parallel;
  return r;
}

// The last traced step's all-reduces over the tensor group whose label starts with
// `prefix`, the 8-byte scalars (the norm's: at most 2 x 8 bus bytes) left out.
std::vector<PlannedCollective> tensor_all_reduces(const RunPlan& p, const std::string& prefix = "") {
  const auto& ops = p.program.ops;
  size_t first = 0;
  for (size_t i = 0, ends = 0; i < ops.size(); ++i)
    if (ops[i].kind == StepOp::Kind::step_end && ++ends == kPlannedSteps - 1) first = i + 1;
  std::vector<PlannedCollective> out;
  for (size_t i = first; i < ops.size(); ++i) {
    if (ops[i].kind != StepOp::Kind::issue) continue;
    const PlannedCollective& c = p.program.collectives[static_cast<size_t>(ops[i].collective)];
    if (c.group == CommGroup::tensor && c.kind == CollectiveKind::all_reduce && c.bus_bytes >= 16 &&
        c.label.rfind(prefix, 0) == 0)
      out.push_back(c);
  }
  return out;
}

}  // namespace

TEST(TensorParallelPlan, ARankMultipliesItsPiecesAndTheWholeParts) {
  const RunPlan whole = plan_run(tiny(1, 1));
  const RunPlan split = plan_run(tiny(2, 2));
  const double C = model_preset("llama-tiny").n_embd;
  ASSERT_EQ(whole.unit_work.size(), split.unit_work.size());
  const size_t M = whole.unit_work.size();
  for (size_t u = 0; u < M; ++u) {
    const UnitWork& w = whole.unit_work[u];
    const UnitWork& s = split.unit_work[u];
    if (u == 0) {
      // The embedding looks up a row per token (vocabulary-parallel: the rows this rank
      // holds, zeros for the rest, then summed), as much as unsplit.
      EXPECT_DOUBLE_EQ(s.forward.elementwise_bytes, w.forward.elementwise_bytes) << "unit " << u;
      EXPECT_DOUBLE_EQ(s.forward.gemm_flops, 0.0) << "unit " << u;
      continue;
    }
    // A layer: T = 2 divides the 4 heads, the 2 key/value heads and the MLP width, so
    // every projection is halved, and attention runs over 2 of the 4 heads; the last
    // unit's head is vocabulary-parallel: half the logits, half the softmax.
    EXPECT_GT(w.forward.gemm_flops, 0.0) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.forward.gemm_flops, w.forward.gemm_flops / 2) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.backward.gemm_flops, w.backward.gemm_flops / 2) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.forward.attention_flops, w.forward.attention_flops / 2) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.backward.attention_flops, w.backward.attention_flops / 2) << "unit " << u;
    EXPECT_DOUBLE_EQ(s.forward.loss_bytes, w.forward.loss_bytes / 2) << "unit " << u;
    // Norms whole, the matrices' proxy (8 bytes per token per n_embd of their elements)
    // halved: the difference is half of the matrices' 8 x elements / C per token, which
    // is 2 / C of their forward FLOPs (2 x elements per token).
    EXPECT_DOUBLE_EQ(w.forward.elementwise_bytes - s.forward.elementwise_bytes,
                     w.forward.gemm_flops * 2 / C)
        << "unit " << u;
  }
  // Model FLOPs per rank (MFU's numerator) are the world's share: the two ranks' rows
  // (one micro-batch) over two ranks.
  EXPECT_DOUBLE_EQ(split.flops_per_step, whole.flops_per_step / 2);
  EXPECT_EQ(split.tensor_parallel, 2);
}

TEST(TensorParallelPlan, SequenceParallelismRunsTheNormsOnARanksShareOfTheTokens) {
  // llama-tiny at T = 2: a layer's two norm weights (n_embd each, replicated) and the
  // final norm run over half of the micro-batch's tokens with --sequence-parallel; the
  // split matrices' GEMMs and elementwise proxy are unchanged.
  RunPlanRequest r = tiny(2, 2);
  const RunPlan tp = plan_run(r);
  r.model.sequence_parallel = true;
  const RunPlan sp = plan_run(r);
  const double C = model_preset("llama-tiny").n_embd;
  const double tokens = static_cast<double>(r.micro_batch) * r.seq_len;
  const size_t M = tp.unit_work.size();
  for (size_t u = 1; u < M; ++u) {
    const double norms = u + 1 == M ? 1 : 2;
    EXPECT_DOUBLE_EQ(tp.unit_work[u].forward.elementwise_bytes - sp.unit_work[u].forward.elementwise_bytes,
                     8 * tokens * norms * C / 2)
        << "unit " << u;
    EXPECT_DOUBLE_EQ(sp.unit_work[u].forward.gemm_flops, tp.unit_work[u].forward.gemm_flops) << "unit " << u;
  }
  EXPECT_DOUBLE_EQ(sp.unit_work[0].forward.elementwise_bytes, tp.unit_work[0].forward.elementwise_bytes);
}

TEST(TensorParallelPlan, TheTensorGroupSumsTwoPartialSumsPerLayerEachWay) {
  for (const bool zero3 : {false, true}) {
    RunPlanRequest r = tiny(4, 2);  // shard=2 x tensor=2
    r.strategy.kind = zero3 ? StrategyKind::zero3 : StrategyKind::ddp;
    const RunPlan p = plan_run(r);
    std::vector<PlannedCollective> reduces = tensor_all_reduces(p, "tensor.attention");
    for (const PlannedCollective& m : tensor_all_reduces(p, "tensor.mlp")) reduces.push_back(m);
    const ModelConfig& c = r.config;
    // Forward: after o_proj and after down_proj; backward: before each half's norm.
    ASSERT_EQ(reduces.size(), static_cast<size_t>(4 * c.n_layer * p.accumulation))
        << (zero3 ? "zero3" : "ddp");
    // The vocabulary-parallel embedding's sum and the head's (row maxima, sum-exp and
    // target logit, the input gradient) for the one logits chunk of 128 rows.
    EXPECT_EQ(tensor_all_reduces(p, "tensor.vocab").size(), 4u * p.accumulation);
    // An all-reduce of B x n_embd fp32 values over 2 ranks sends 2 (T-1)/T of them.
    const double bytes = 4.0 * r.micro_batch * r.seq_len * c.n_embd;
    for (const PlannedCollective& a : reduces) EXPECT_DOUBLE_EQ(a.bus_bytes, bytes) << a.label;
    if (zero3) continue;
    // ddp's parameters are the local pieces: half of each layer's matrices and of the
    // vocabulary-parallel embedding and (untied) head fewer than the unsplit model's (up
    // to the alignment of each parameter and unit).
    RunPlanRequest one = tiny(2, 1);
    const RunPlan unsplit = plan_run(one);
    const double layer_matrices =
        c.n_embd * (c.n_head + 2.0 * c.kv_heads()) * c.head_dim() + c.n_head * c.head_dim() * c.n_embd +
        3.0 * c.n_embd * c.mlp_width();
    const double vocab_tables = (c.tie_embeddings ? 1.0 : 2.0) * c.padded_vocab_size() * c.n_embd;
    EXPECT_NEAR(static_cast<double>(unsplit.params - p.params),
                4 * (c.n_layer * layer_matrices + vocab_tables) / 2, 4 * 64.0 * 8 * c.n_layer);
  }
}

TEST(TensorParallelPlan, ReplicatedKeyValueHeadsArePlanned) {
  // T = 4 over llama-tiny's 2 key/value heads: pairs of ranks hold the same head and
  // sum its gradient (a split of the tensor group the traced step must expect).
  RunPlanRequest r = tiny(4, 4);
  r.strategy.kind = StrategyKind::zero3;
  const RunPlan p = plan_run(r);
  bool kv_sum = false;
  for (const PlannedCollective& c : p.program.collectives)
    kv_sum = kv_sum || (c.group == CommGroup::tensor && c.label.find("kv") != std::string::npos);
  EXPECT_TRUE(kv_sum);
  EXPECT_EQ(tensor_all_reduces(p).size(), last_step_traffic(p, CommGroup::tensor).calls);
  EXPECT_GE(tensor_all_reduces(p).size(), static_cast<size_t>(4 * r.config.n_layer));
}

TEST(TensorParallelPlan, TheTensorGroupSitsInsideANode) {
  // 8 nodes x 8 ranks, zero3 x T = 8: tensor groups are nodes; each shard group (one
  // rank per node, 8 apart) crosses the links, 8 of them through each node's.
  const GroupPlacement tensor = place_group(CommGroup::tensor, 64, 8, 8, 1, 8);
  EXPECT_TRUE(tensor.within_node);
  const GroupPlacement shard = place_group(CommGroup::shard, 64, 8, 8, 1, 8);
  EXPECT_FALSE(shard.within_node);
  EXPECT_EQ(shard.nic_sharing, 8);
  // T = 2, shard groups of 4: each spans 8 ranks, a node.
  EXPECT_TRUE(place_group(CommGroup::shard, 64, 4, 8, 1, 2).within_node);
  // hybrid replicate=4 x shard=2 x tensor=8: replicas 16 ranks apart, 8 rings per link.
  EXPECT_EQ(place_group(CommGroup::replica, 64, 2, 8, 1, 8).nic_sharing, 8);
  // A tensor group wider than a node crosses it.
  EXPECT_FALSE(place_group(CommGroup::tensor, 64, 4, 8, 1, 16).within_node);
}

TEST(TensorParallelPlan, TimeModelKeepsTensorTrafficOnTheNode) {
  // 2 nodes x 4 ranks, zero3 x T = 4: the tensor all-reduces on the node, zero3's
  // gathers and reduce-scatters (shard groups of 2, one rank per node) between them.
  RunPlanRequest r;
  r.config = model_preset("llama-tiny");
  r.micro_batch = 1;
  r.seq_len = 128;
  r.world_size = 8;
  r.strategy.tensor_parallel = 4;
  r.strategy.kind = StrategyKind::zero3;
  r.model.device = Device{DeviceKind::cuda, 0};
  r.model.precision = r.strategy.param_dtype = DType::bf16;
  const RunPlan p = plan_run(r);
  const HardwareProfile profile = builtin_profile("h100-80g");
  const StepTimePrediction t = predict_step_time(p, profile, ClusterShape{2, ""});
  ASSERT_EQ(p.partition, 2);
  EXPECT_EQ(t.intra_transport, profile.intra_node.name);
  EXPECT_EQ(t.inter_transport, profile.inter_node.name);
  // Two partial sums per layer each way, the replicated key/value heads' gradient
  // summed over the 2 ranks that hold each (llama-tiny has 2 for 4 ranks), and the
  // vocabulary-parallel embedding's and head's four.
  EXPECT_EQ(last_step_traffic(p, CommGroup::tensor).calls, 5 * r.config.n_layer + 4);
  EXPECT_GT(last_step_traffic(p, CommGroup::shard).calls, 0);
}

// Backward overlaps each column-parallel input gradient's reduction with the weight
// gradient's GEMM (TensorParallelBlock::start_sum_partial): the traced program has that
// GEMM between the reduction's issue and its wait, so the time model exposes only
// max(0, reduction - GEMM). And a unit's work is counted once (its UnitWork, shared out
// over the stretches between its collectives), not its kernels' beside it.
namespace {

std::vector<StepOp> last_step_ops(const RunPlan& p) {
  const auto& ops = p.program.ops;
  size_t first = 0;
  for (size_t i = 0, ends = 0; i < ops.size(); ++i)
    if (ops[i].kind == StepOp::Kind::step_end && ++ends == kPlannedSteps - 1) first = i + 1;
  return {ops.begin() + static_cast<std::ptrdiff_t>(first), ops.end()};
}

bool overlapped_reduction(const PlannedCollective& c) {
  return c.label == "tensor.mlp_in_grad" || c.label == "tensor.attention_in_grad";
}

// A rank's weight-gradient GEMM FLOPs under the reduction: gate|up's (2 x tokens x
// n_embd x 2 mlp / T) under the MLP's, q|k|v's (2 x tokens x n_embd x (H + 2 KV) hd / T)
// under attention's.
double weight_gradient_flops(const RunPlanRequest& r, const PlannedCollective& c) {
  const ModelConfig& m = r.config;
  const double tokens = static_cast<double>(r.micro_batch) * r.seq_len;
  const double T = r.strategy.tensor_parallel;
  if (c.label == "tensor.mlp_in_grad") return 2 * tokens * m.n_embd * 2.0 * m.mlp_width() / T;
  return 2 * tokens * m.n_embd * (m.n_head + 2.0 * m.kv_heads()) * m.head_dim() / T;
}

}  // namespace

TEST(TensorParallelPlan, BackwardComputesTheWeightGradientWhileTheInputGradientIsSummed) {
  const RunPlanRequest r = tiny(2, 2);  // llama-tiny, ddp x T = 2: no data-parallel traffic
  const RunPlan p = plan_run(r);
  ASSERT_EQ(p.accumulation, 1);
  const std::vector<StepOp> ops = last_step_ops(p);
  int overlapped = 0;
  std::map<std::string, ComputeWork> by_unit;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == StepOp::Kind::compute) {
      by_unit[ops[i].label] += ops[i].work;
      // GEMMs are the units' alone (the kernels' own count of them is not added again).
      if (ops[i].label.find(" unit ") == std::string::npos) {
        EXPECT_EQ(ops[i].work.gemm_flops, 0.0) << i;
      }
    }
    if (ops[i].kind != StepOp::Kind::issue) continue;
    const PlannedCollective& c = p.program.collectives[static_cast<size_t>(ops[i].collective)];
    if (!overlapped_reduction(c)) continue;
    ++overlapped;
    double between = 0;
    size_t j = i + 1;
    for (; j < ops.size() && ops[j].kind == StepOp::Kind::compute; ++j) between += ops[j].work.gemm_flops;
    ASSERT_LT(j, ops.size());
    EXPECT_EQ(ops[j].kind, StepOp::Kind::wait) << c.label;
    EXPECT_EQ(ops[j].collective, ops[i].collective) << c.label;
    EXPECT_DOUBLE_EQ(between, weight_gradient_flops(r, c)) << c.label;
  }
  EXPECT_EQ(overlapped, 2 * r.config.n_layer);
  // Each unit's pass adds up to its UnitWork once.
  for (size_t u = 0; u < p.unit_work.size(); ++u)
    for (const auto& [pass, work] : {std::pair{"forward", p.unit_work[u].forward},
                                     std::pair{"backward", p.unit_work[u].backward}}) {
      const ComputeWork& traced = by_unit[fmt::format("{} unit {}", pass, u)];
      EXPECT_NEAR(traced.gemm_flops, work.gemm_flops, 1e-9 * work.gemm_flops) << pass << " " << u;
      EXPECT_NEAR(traced.attention_flops, work.attention_flops, 1e-9 * work.attention_flops) << pass << " " << u;
      EXPECT_NEAR(traced.elementwise_bytes, work.elementwise_bytes, 1e-9 * work.elementwise_bytes)
          << pass << " " << u;
    }
}

TEST(TensorParallelPlan, OnlyTheReductionTimeBeyondTheWeightGradientGemmIsExposed) {
  // GEMMs at 1e9 FLOP/s, everything else free; collectives at `bandwidth` bus bytes/s,
  // no latency, no slowdown of compute beside them. Every tensor collective but the two
  // overlapped ones per layer is waited for as soon as it is issued (exposed whole);
  // those expose max(0, reduction - weight-gradient GEMM).
  const RunPlanRequest r = tiny(2, 2);
  const RunPlan p = plan_run(r);
  constexpr double kGemm = 1e9;
  const double reduction_bytes = 4.0 * r.micro_batch * r.seq_len * r.config.n_embd;  // [tokens, C] fp32
  // The reduction lasts 1, 3 and 5 ms: hidden behind both GEMMs (3.9 ms under the MLP's,
  // 2.4 ms under attention's), behind the MLP's only, behind neither.
  for (const double reduction_s : {1e-3, 3e-3, 5e-3}) {
    const double bandwidth = reduction_bytes / reduction_s;
    HardwareProfile profile;
    profile.name = "test";
    ComputeFigures c;
    c.ranks_per_node = 2;
    c.by_precision["fp32"] = {kGemm, 1e30, 1e30, 1e30, 1e30};
    profile.compute.push_back(c);
    profile.ranks_per_node = 2;
    const CollectiveRate rate{0, bandwidth};
    profile.intra_node = {"test", rate, rate, rate, rate, rate, 1.0};
    profile.inter_node = profile.intra_node;
    const StepTimePrediction t = predict_step_time(p, profile, ClusterShape{1, ""});
    double exposed = 0, compute = 0;
    for (const StepOp& op : last_step_ops(p)) {
      compute += op.work.gemm_flops / kGemm;
      if (op.kind != StepOp::Kind::issue) continue;
      const PlannedCollective& k = p.program.collectives[static_cast<size_t>(op.collective)];
      const double seconds = k.bus_bytes / bandwidth;
      exposed += overlapped_reduction(k)
                     ? std::max(0.0, seconds - weight_gradient_flops(r, k) / kGemm)
                     : seconds;
    }
    // Compute: each unit's GEMMs once (the unsplit half of llama-tiny's per rank).
    double unit_gemm = 0;
    for (const UnitWork& w : p.unit_work) unit_gemm += w.forward.gemm_flops + w.backward.gemm_flops;
    EXPECT_NEAR(t.compute_s, unit_gemm / kGemm, 1e-12) << reduction_s;
    EXPECT_NEAR(compute, t.compute_s, 1e-12);
    EXPECT_NEAR(t.exposed_s, exposed, 1e-12) << reduction_s;
    EXPECT_NEAR(t.step_s, t.compute_s + exposed, 1e-12) << reduction_s;
  }
}

// --strategy auto's search over tensor (and context) parallelism.
namespace {

RunPlanRequest long_rows() {
  RunPlanRequest r;
  r.config = model_preset("llama-tiny");
  r.micro_batch = 1;  // no smaller micro-batch to try
  r.seq_len = 1024;   // activations dominate
  r.world_size = 4;
  r.model.precision = r.strategy.param_dtype = DType::bf16;  // no bf16 to try
  return r;
}

double least_total(const std::vector<Candidate>& candidates) {
  double least = std::numeric_limits<double>::infinity();
  for (const Candidate& c : candidates) least = std::min(least, static_cast<double>(c.plan.total()));
  return least;
}

}  // namespace

TEST(TensorParallelAuto, TensorSizesAreNodeDivisorsThatSplitTheModel) {
  RunPlanRequest r = long_rows();
  r.world_size = 16;
  // llama-tiny: 4 heads, 2 key/value heads (replicated at T = 4), MLP 160; 8 ranks a node.
  EXPECT_EQ(tensor_parallel_choices(r, ClusterShape{2, ""}), (std::vector<int>{1, 2, 4}));
  // 2 ranks a node: the tensor group stays inside it.
  EXPECT_EQ(tensor_parallel_choices(r, ClusterShape{8, ""}), (std::vector<int>{1, 2}));
  r.strategy.tensor_parallel = 2;  // asked for: kept
  EXPECT_EQ(tensor_parallel_choices(r, ClusterShape{2, ""}), (std::vector<int>{2}));
  r.strategy.tensor_parallel = 1;
  r.config = model_preset("gpt2-tiny");  // 4 heads, MLP 512, vocabulary 50304 rows
  EXPECT_EQ(tensor_parallel_choices(r, ClusterShape{2, ""}), (std::vector<int>{1, 2, 4}));
  r.config = model_preset("qwen3-moe-tiny");  // not split (a mixture of experts)
  EXPECT_EQ(tensor_parallel_choices(r, ClusterShape{2, ""}), (std::vector<int>{1}));
  // Context parallelism (Ulysses): P dividing the 4 heads and the 1024 tokens, in a node.
  EXPECT_EQ(context_parallel_choices(long_rows(), ClusterShape{1, ""}), (std::vector<int>{2, 4}));
}

TEST(TensorParallelAuto, ChoosesTensorParallelismWhenOnlyItFits) {
  const RunPlanRequest base = long_rows();
  const ClusterShape one_node{1, ""};
  const auto unsplit = plan_candidates(base, nullptr, one_node, true);
  const double budget = least_total(unsplit) - 1;  // nothing at T = 1 fits
  const AutoSearch search = auto_search(base, nullptr, one_node, MemoryBudget(budget));
  ASSERT_TRUE(search.recommendation.chosen) << search.recommendation.explanation;
  const Candidate& c = search.candidates[*search.recommendation.chosen];
  EXPECT_GT(c.request.strategy.tensor_parallel, 1) << c.label;
  EXPECT_EQ(c.request.strategy.context_parallel, 1) << c.label;
  EXPECT_NE(c.label.find(" x tp"), std::string::npos) << c.label;
  EXPECT_NE(candidate_flags(c).find("--tensor-parallel "), std::string::npos) << candidate_flags(c);
  // plan for a named strategy tries T = 1 only, and says what would fit.
  const Recommendation fixed = recommend(unsplit, MemoryBudget(budget), base, nullptr, one_node);
  EXPECT_FALSE(fixed.chosen);
  EXPECT_NE(fixed.explanation.find("the smallest change that fits is --tensor-parallel "),
            std::string::npos)
      << fixed.explanation;
}

TEST(TensorParallelAuto, SplitsTheSequenceWhenNoLayoutFitsWhole) {
  const RunPlanRequest base = long_rows();
  const ClusterShape one_node{1, ""};
  const auto whole = plan_candidates(base, nullptr, one_node, true, tensor_parallel_choices(base, one_node));
  const double budget = least_total(whole) - 1;  // nothing at P = 1 fits, whatever T
  const AutoSearch search = auto_search(base, nullptr, one_node, MemoryBudget(budget));
  ASSERT_TRUE(search.recommendation.chosen) << search.recommendation.explanation;
  const Candidate& c = search.candidates[*search.recommendation.chosen];
  EXPECT_GT(c.request.strategy.context_parallel, 1) << c.label;
  EXPECT_LE(static_cast<double>(c.plan.total()), budget);
  EXPECT_NE(search.recommendation.explanation.find("no layout fits without --context-parallel"),
            std::string::npos)
      << search.recommendation.explanation;
  EXPECT_NE(candidate_flags(c).find("--context-parallel "), std::string::npos);
  // A named layout's plan names the change: at T = 2 (2 x 2 ranks) --context-parallel 2.
  RunPlanRequest asked = base;
  asked.strategy.tensor_parallel = 2;
  const auto at2 = plan_candidates(asked, nullptr, one_node, true);
  ASSERT_GT(least_total(at2), budget);
  EXPECT_EQ(context_parallel_choices(asked, one_node), (std::vector<int>{2}));
  const Recommendation fixed = recommend(at2, MemoryBudget(budget), asked, nullptr, one_node);
  EXPECT_FALSE(fixed.chosen);
  EXPECT_NE(fixed.explanation.find("the smallest change that fits is --context-parallel 2"),
            std::string::npos)
      << fixed.explanation;
}
