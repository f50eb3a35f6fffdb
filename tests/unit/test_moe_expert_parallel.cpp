// Expert parallelism in the model (MoeExperts' dispatch and combine over an expert
// group, moe_expert_parallel.cpp), against the same model without it: P ranks (threads
// of an InProcessJob), each with its own rows and every parameter, hold E/P experts
// each. Each rank's loss, aux loss and every gradient of the units it computes alone
// (embeddings, attention, routers, norms, head) must be bitwise those of a one-rank
// model on its rows; each held expert's gradient is the sum of the one-rank models'
// gradients of that expert over the group's rows (within float rounding of the
// order: summed in one buffer here, rank by rank there); experts held elsewhere get
// no gradient. With activation checkpointing (the holders receive the h2 rows again in
// backward and recompute) the same, against the one-rank model without it. However the
// exchanges are chunked (one per layer and way on the host, one per held expert on a
// device, or any run of held experts) every result is bitwise the same. On a device the
// exchanges go one held expert at a time, each beside another held expert's GEMMs (the
// traced step plan times); on the host one each way per layer. Bad groups are one-line
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "llama_fixture_support.hpp"
#include "relative_error.hpp"
#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/plan/run_plan.hpp"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

// Rank r's rows: the fixture's tokens shifted by r (another routing on every rank).
std::vector<int32_t> tokens_of(const Reference& ref, int rank) {
  std::vector<int32_t> t = ref.tokens;
  for (auto& v : t) v = (v + 7 * rank) % ref.config.vocab_size;
  return t;
}

struct RankRun {
  double loss_sum = 0, aux = 0;
  std::vector<std::vector<float>> grads;  // per flat unit
};

// (exchange_chunks: ModelOptions::expert_exchange_chunks)
RankRun run_rank(const Reference& ref, const ParamLayout& layout, int rank,
                 Communicator* expert_group, bool checkpointing = false, int exchange_chunks = 0) {
  ModelOptions options;
  options.parallel_groups.expert = expert_group;
  options.activation_checkpointing = checkpointing;
  options.expert_exchange_chunks = exchange_chunks;
  auto model = make_model(ref, layout, ref.B, options);
  UnitBuffers buf(layout, ref.file);
  const std::vector<int32_t> tokens = tokens_of(ref, rank);
  MicroBatch batch{tokens.data(), ref.targets.data(), ref.B, ref.T};
  batch.aux_loss_share = 1.0f;
  train_micro_batch(*model, buf, batch, 1.0f / static_cast<float>(ref.count));
  return {model->last_loss_sum(), model->last_aux_loss(), buf.grads};
}

// Which layer-local expert a flat unit is ("model.layers.L.experts.E..."), or -1.
int expert_of(const UnitLayout& u) {
  const auto at = u.name.find(".experts.");
  if (at == std::string::npos) return -1;
  return std::stoi(u.name.substr(at + 9));
}

// (family, P, activation checkpointing under expert parallelism: the holders receive
// the h2 rows again in backward and recompute; compared with the one-rank model
// without it.)
class MoeExpertParallel : public ::testing::TestWithParam<std::tuple<std::string, int, bool>> {};

TEST_P(MoeExpertParallel, EachRankComputesWhatItWouldAloneAndHeldExpertsSumTheGroup) {
  const auto& [family, P, checkpointing] = GetParam();
  const Reference ref = load_reference(family);
  const int E = ref.config.moe.num_experts;
  ASSERT_EQ(E % P, 0);
  const auto layout = ParamLayout::build(ref.config, 1);
  std::vector<RankRun> alone;
  for (int r = 0; r < P; ++r) alone.push_back(run_rank(ref, layout, r, nullptr));

  std::vector<RankRun> parallel(static_cast<size_t>(P));
  InProcessJob job(P);
  const auto errors = job.run([&](Communicator& world) {
    parallel[static_cast<size_t>(world.rank())] =
        run_rank(ref, layout, world.rank(), &world, checkpointing);
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");

  int expert_units = 0;
  for (int r = 0; r < P; ++r) {
    const RankRun& a = alone[static_cast<size_t>(r)];
    const RankRun& p = parallel[static_cast<size_t>(r)];
    EXPECT_EQ(p.loss_sum, a.loss_sum) << "rank " << r;
    EXPECT_EQ(p.aux, a.aux) << "rank " << r;
    for (int u = 0; u < layout.num_units(); ++u) {
      const auto& got = p.grads[static_cast<size_t>(u)];
      const int e = expert_of(layout.units[static_cast<size_t>(u)]);
      if (e < 0) {
        EXPECT_EQ(got, a.grads[static_cast<size_t>(u)]) << layout.units[u].name << " rank " << r;
      } else if (e / (E / P) != r) {
        for (float g : got) ASSERT_EQ(g, 0.0f) << layout.units[u].name << " rank " << r;
      } else {
        ++expert_units;
        std::vector<float> want(got.size(), 0.0f);
        for (const RankRun& s : alone)
          for (size_t i = 0; i < want.size(); ++i) want[i] += s.grads[static_cast<size_t>(u)][i];
        EXPECT_LT(relative_to_max_error(got, want), 1e-6) << layout.units[u].name;
        double norm = 0;
        for (float g : want) norm += static_cast<double>(g) * g;
        EXPECT_GT(norm, 0.0) << layout.units[u].name;  // the expert got tokens
      }
    }
  }
  // Every expert of every sparse layer is held by exactly one rank.
  EXPECT_EQ(expert_units, E * ref.config.moe.sparse_layers(ref.config.n_layer));
}

INSTANTIATE_TEST_SUITE_P(Groups, MoeExpertParallel,
                         ::testing::Combine(::testing::Values("qwen3_moe", "mixtral"),
                                            ::testing::Values(2, 4), ::testing::Bool()));

// Every rank's loss, aux loss and gradients with the exchanges in one chunk per layer
// and way (the host's default) are bitwise those with one per held expert (a device's)
// and with uneven runs of held experts: each GEMM reads the same rows in the same order
// and every sum keeps its order; only where the rows lie in the exchange buffers moves.
TEST_P(MoeExpertParallel, ChunkingTheExchangesLeavesEveryResultBitwise) {
  const auto& [family, P, checkpointing] = GetParam();
  const Reference ref = load_reference(family);
  const int held = ref.config.moe.num_experts / P;
  const auto layout = ParamLayout::build(ref.config, 1);
  const auto run_group = [&](int chunks) {
    std::vector<RankRun> runs(static_cast<size_t>(P));
    InProcessJob job(P);
    const auto errors = job.run([&](Communicator& world) {
      runs[static_cast<size_t>(world.rank())] =
          run_rank(ref, layout, world.rank(), &world, checkpointing, chunks);
    });
    for (const auto& e : errors) EXPECT_EQ(e, "");
    return runs;
  };
  const std::vector<RankRun> whole_layer = run_group(1);
  if (held == 1) GTEST_SKIP() << "one held expert: one chunk either way";
  std::vector<int> chunkings = {held};  // one per held expert
  if (held > 2) chunkings.push_back(held - 1);  // uneven runs (4 held: 1, 1, 2)
  for (int chunks : chunkings) {
    const std::vector<RankRun> chunked = run_group(chunks);
    for (int r = 0; r < P; ++r) {
      const RankRun& a = whole_layer[static_cast<size_t>(r)];
      const RankRun& b = chunked[static_cast<size_t>(r)];
      EXPECT_EQ(b.loss_sum, a.loss_sum) << chunks << " chunks, rank " << r;
      EXPECT_EQ(b.aux, a.aux) << chunks << " chunks, rank " << r;
      for (int u = 0; u < layout.num_units(); ++u)
        EXPECT_EQ(b.grads[static_cast<size_t>(u)], a.grads[static_cast<size_t>(u)])
            << layout.units[static_cast<size_t>(u)].name << ", " << chunks << " chunks, rank " << r;
    }
  }
}

// The expert exchanges of the step plan traces (the real schedule on the meta device)
// by label: how many, and the least GEMM work between an issue and its wait. At N = 2,
// E = 2 each rank holds 4 of qwen3-moe-tiny's 8 experts.
struct Seen {
  int count = 0;
  double least_gemm_flops_beside = -1;  // between issue and wait: the least of them
};
std::map<std::string, Seen> traced_expert_exchanges(Device device) {
  RunPlanRequest r;
  r.config = model_preset("qwen3-moe-tiny");
  r.world_size = 2;
  r.strategy.expert_parallel = 2;
  r.model.device = device;
  r.micro_batch = 2;
  r.seq_len = 32;
  const RunPlan p = plan_run(r);
  const auto& ops = p.program.ops;
  std::vector<size_t> issued(p.program.collectives.size(), 0);
  std::map<std::string, Seen> seen;
  for (size_t i = 0; i < ops.size(); ++i) {
    const size_t c = static_cast<size_t>(ops[i].collective);
    if (ops[i].kind == StepOp::Kind::issue) issued[c] = i;
    if (ops[i].kind != StepOp::Kind::wait) continue;
    const std::string& label = p.program.collectives[c].label;
    if (label.rfind("expert ", 0) != 0) continue;
    double beside = 0;
    for (size_t j = issued[c] + 1; j < i; ++j)
      if (ops[j].kind == StepOp::Kind::compute) beside += ops[j].work.gemm_flops;
    Seen& s = seen[label];
    ++s.count;
    if (s.least_gemm_flops_beside < 0 || beside < s.least_gemm_flops_beside)
      s.least_gemm_flops_beside = beside;
  }
  return seen;
}

constexpr int kHeldExperts = 4;
// Each exchange's label, and on a device the one chunk with no other held expert's
// GEMMs beside it (waited for first, or issued last).
struct Exchange {
  const char* label;
  int exposed_chunk;
};
const Exchange kExchanges[] = {{"expert dispatch", 0},
                               {"expert combine", kHeldExperts - 1},
                               {"expert dispatch dy", kHeldExperts - 1},
                               {"expert dispatch weights", kHeldExperts - 1},
                               {"expert combine dh2", 0},
                               {"expert combine weights' gradients", 0}};

// On a device: after a layer's router one dispatch per held expert, each waited for
// right before its expert's GEMMs, so that the later ones travel beside the earlier
// experts' GEMMs; each expert's outputs start back at once and are waited for after the
// last held expert; backward the same in reverse.
TEST(MoeExpertParallelPlan, OnADeviceEachHeldExpertsRowsTravelBesideAnotherHeldExpertsGemms) {
  std::map<std::string, Seen> seen = traced_expert_exchanges(Device{DeviceKind::cuda, 0});
  const int exchanges = seen["expert dispatch counts"].count;  // one per sparse layer's forward
  ASSERT_GT(exchanges, 0);
  for (int c = 0; c < kHeldExperts; ++c)
    for (const auto& [what, exposed_chunk] : kExchanges) {
      const std::string label = std::string(what) + " " + std::to_string(c);
      const Seen& s = seen[label];
      EXPECT_EQ(s.count, exchanges) << label;
      if (c != exposed_chunk) {
        EXPECT_GT(s.least_gemm_flops_beside, 0.0) << label;
      }
    }
}

// On the host (a CPU run's plan, as the run does): each way one exchange per layer of
// every held expert's rows, with nothing to run beside.
TEST(MoeExpertParallelPlan, OnTheHostEachLayerExchangesOnceEachWay) {
  std::map<std::string, Seen> seen = traced_expert_exchanges(Device{});
  const int exchanges = seen["expert dispatch counts"].count;
  ASSERT_GT(exchanges, 0);
  for (const auto& [what, exposed_chunk] : kExchanges) {
    (void)exposed_chunk;
    EXPECT_EQ(seen[std::string(what) + " 0"].count, exchanges) << what;
    for (int c = 1; c < kHeldExperts; ++c)
      EXPECT_EQ(seen.count(std::string(what) + " " + std::to_string(c)), 0u) << what << " " << c;
  }
}

TEST(MoeExpertParallelBadInput, ExpertsThatTheGroupCannotShareAreRefusedByName) {
  const Reference ref = load_reference("qwen3_moe");
  const auto layout = ParamLayout::build(ref.config, 1);
  InProcessJob job(3);
  const auto errors = job.run([&](Communicator& world) {
    ModelOptions options;
    options.parallel_groups.expert = &world;
    make_model(ref, layout, ref.B, options);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("--expert-parallel 3: the model has 8 experts per layer"), std::string::npos)
        << e;
}

}  // namespace
