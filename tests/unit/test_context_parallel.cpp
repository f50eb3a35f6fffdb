// Context parallelism in the model (model/context_parallel/): P ranks that each hold
// T / P tokens of every row give the loss and every gradient of one rank holding the
// whole rows, summed over the ranks, for padded and packed rows (documents with their
// own positions and key_begin), with and without activation checkpointing: Ulysses with
// the KV heads split (P divides them) and replicated (P a multiple of them), ring
// attention with the zigzag split at P = 2, 3 and 4 (packed documents crossing chunks),
// hybrid (Ulysses groups of U = 2 in a ring of 2 at P = 4); gpt2 (learned positions:
// each rank's wpe rows are its tokens' global positions, the zigzag's too; fused biased
// c_attn) under the three kinds, in fp32 and bf16 (against one bf16 rank); LoRA of the
// mixtures of experts' routed experts, and the mixtures of experts with expert
// parallelism outside the context ranks (E x P ranks). The reference is the same model without a context
// group on the whole micro-batch (itself held to float64 transformers by
// test_llama_fixture and the gpt2 fixture tests). Not bitwise: each rank's weight
// gradients sum over its own tokens, and those partial sums are added across ranks,
// in another order than one GEMM over all tokens.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/model/family.hpp"
#include "tiny_family_config.hpp"

namespace shardlm {
namespace {

struct Weights {
  std::vector<std::vector<float>> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;
  // Frozen units (a LoRA run's base) get no gradient buffer, as a strategy hands them.
  Weights(const Model& model, const ParamLayout& layout) {
    for (int u = 0; u < layout.num_units(); ++u) {
      params.emplace_back(layout.units[static_cast<size_t>(u)].padded_numel, 0.0f);
      grads.emplace_back(layout.units[static_cast<size_t>(u)].padded_numel, 0.0f);
      model.init_unit(u, 7, params.back().data());
      Rng rng(100 + static_cast<uint64_t>(u));
      for (float& p : params.back()) p += 0.02f * (static_cast<float>(rng.uniform()) - 0.5f);
    }
    for (const auto& place : layout.model_units) {
      param_ptrs.push_back(params[static_cast<size_t>(place.unit)].data() + place.base);
      grad_ptrs.push_back(layout.units[static_cast<size_t>(place.unit)].trainable
                              ? grads[static_cast<size_t>(place.unit)].data() + place.base
                              : nullptr);
    }
  }
};

double run(Model& model, Weights& w, const MicroBatch& batch) {
  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, w.param_ptrs, w.grad_ptrs, batch, true, 1.0f);
  for (int u = model.num_units() - 1; u >= 0; --u) model.backward_unit(u, w.param_ptrs, w.grad_ptrs, batch);
  return model.last_loss_sum();
}

struct Rows {
  std::vector<int32_t> tokens, targets, positions, key_begin;
  MicroBatch batch(int B, int T, bool packed) const {
    MicroBatch m;
    m.tokens = tokens.data();
    m.targets = targets.data();
    m.B = B;
    m.T = T;
    if (packed) {
      m.positions = positions.data();
      m.key_begin = key_begin.data();
    }
    return m;
  }
};

// B rows of T tokens; packed: each row holds documents of 11 and T - 11 tokens.
Rows make_rows(int B, int T, int vocab, uint64_t seed = 5) {
  Rows r;
  Rng rng(seed);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      r.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
      r.targets.push_back(t % 7 == 3 ? kIgnoreIndex : static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
      const int doc_start = t < 11 ? 0 : 11;
      r.positions.push_back(t - doc_start);
      r.key_begin.push_back(doc_start);
    }
  return r;
}

struct Case {
  std::string preset;
  int P;
  bool packed;
  bool checkpointing;
  ContextParallelKind kind = ContextParallelKind::ulysses;
  int ulysses_degree = 1;  // hybrid's
  int n_head = 0;          // 0: the preset's
  double aux_coef = -1;    // mixtures of experts: the load-balancing loss's (-1: the preset's)
  DType precision = DType::fp32;
  std::vector<std::string> lora_targets{};  // rank-4 adapters on these modules; empty: none
  // Expert parallelism with the context ranks: E x P ranks, expert coordinate x (the
  // outer one, as the mesh lays them out) reading rows of its own, its experts' tokens
  // exchanged with the other expert coordinates of its context coordinate.
  int E = 1;
  // The expert group spans the context ranks (E > the data-parallel ranks): E / P data
  // coordinates x P context ranks, every rank holding E_local experts of its own, a
  // context rank's tokens routed to any of them.
  bool experts_span_context = false;
};

// bf16 rounds every GEMM's inputs and outputs, and each rank's partial sums round where
// one GEMM's did not: held to the 1e-2 relative that bf16 has against fp32 elsewhere in
// the project (test_moe_fixture's losses, tensor_parallel.sh, mixed_precision_equivalence).
double loss_tolerance(DType precision) { return precision == DType::fp32 ? 1e-6 : 1e-2; }
double gradient_tolerance(DType precision) { return precision == DType::fp32 ? 1e-5 : 1e-2; }

void expect_context_parallel_matches(const Case& c) {
  const std::string kind = context_parallel_kind_name(c.kind);
  const std::string variant = fmt::format(
      "{}{}{}{}", c.packed ? "packed" : "padded", c.checkpointing ? " checkpointing" : "",
      c.precision != DType::fp32 ? fmt::format(" {}", dtype_name(c.precision)) : "",
      c.lora_targets.empty() ? "" : fmt::format(" lora {}", fmt::join(c.lora_targets, ",")));
  SCOPED_TRACE(c.preset + " " + kind + " P=" + std::to_string(c.P) + " U=" + std::to_string(c.ulysses_degree) +
               " E=" + std::to_string(c.E) + (c.experts_span_context ? " over the context ranks " : " ") + variant);
  ModelConfig config = tiny_family_config(c.preset);
  if (c.n_head > 0) config.n_head = c.n_head;
  if (c.aux_coef >= 0) config.moe.router_aux_loss_coef = c.aux_coef;
  if (!c.lora_targets.empty()) {
    config.lora.rank = 4;
    config.lora.targets = c.lora_targets;
  }
  const int B = 2, T = 24;
  const ParamLayout layout = ParamLayout::build(config, 1, 0);
  const int data_ranks = c.experts_span_context ? c.E / c.P : c.E;  // rows' coordinates
  std::vector<Rows> rows;  // per data coordinate
  for (int x = 0; x < data_ranks; ++x) rows.push_back(make_rows(B, T, config.vocab_size, 5 + static_cast<uint64_t>(x)));
  ModelOptions options;
  options.activation_checkpointing = c.checkpointing;
  options.precision = c.precision;
  // The reference: one model on each expert coordinate's whole rows.
  std::vector<Weights> reference;
  double want_loss = 0.0;
  int64_t want_count = 0;
  std::vector<double> want_aux;
  std::vector<std::vector<double>> want_routed;
  for (int x = 0; x < data_ranks; ++x) {
    auto reference_model = model_family(config.family).make_model(config, layout, B, T, options,
                                                                  MemoryTracker::global());
    reference.emplace_back(*reference_model, layout);
    MicroBatch full = rows[static_cast<size_t>(x)].batch(B, T, c.packed);
    full.aux_loss_share = 1.0f;  // the load-balancing loss's gradient at full weight
    want_loss += run(*reference_model, reference.back(), full);
    want_count += reference_model->last_target_count();
    want_aux.push_back(reference_model->last_aux_loss());
    want_routed.push_back(reference_model->last_expert_tokens());
  }

  const int ranks = data_ranks * c.P;
  std::vector<Weights> per_rank;
  std::vector<double> losses(static_cast<size_t>(ranks));
  std::vector<int64_t> counts(static_cast<size_t>(ranks));
  std::vector<double> aux(static_cast<size_t>(ranks));
  std::vector<std::vector<double>> routed(static_cast<size_t>(ranks));
  std::mutex mutex;
  CommOptions comm_options;
  comm_options.timeout_seconds = 20;  // a rank that fails leaves the others waiting no longer
  InProcessJob job(ranks, comm_options);
  const auto errors = job.run([&](Communicator& world) {
    const int x = world.rank() / c.P;
    std::unique_ptr<Communicator> context_group, expert_group;
    ModelOptions o = options;
    o.parallel_groups.context = &world;
    if (data_ranks > 1) context_group = world.split(x, world.rank() % c.P, "context group");
    if (context_group) o.parallel_groups.context = context_group.get();
    if (c.experts_span_context) {
      o.parallel_groups.expert = &world;  // the expert x context group: every rank here
    } else if (c.E > 1) {
      expert_group = world.split(world.rank() % c.P, x, "expert group");
      o.parallel_groups.expert = expert_group.get();
    }
    o.context_parallel_kind = c.kind;
    o.ulysses_degree = c.ulysses_degree;
    auto model = model_family(config.family).make_model(config, layout, B, T, o, MemoryTracker::global());
    Weights w(*model, layout);
    const size_t r = static_cast<size_t>(world.rank());
    MicroBatch full = rows[static_cast<size_t>(x)].batch(B, T, c.packed);
    full.aux_loss_share = 1.0f;
    losses[r] = run(*model, w, full);
    counts[r] = model->last_target_count();
    aux[r] = model->last_aux_loss();
    routed[r] = model->last_expert_tokens();
    std::lock_guard lock(mutex);
    per_rank.push_back(std::move(w));
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (const auto& e : errors) ASSERT_EQ(e, "");
  double loss = 0.0;
  int64_t count = 0;
  for (size_t r = 0; r < losses.size(); ++r) loss += losses[r], count += counts[r];
  EXPECT_EQ(count, want_count);
  EXPECT_NEAR(loss, want_loss, loss_tolerance(c.precision) * std::abs(want_loss));
  // The load-balancing loss and the assignments are the whole rows' on every rank.
  for (size_t r = 0; r < aux.size(); ++r) {
    const size_t x = r / static_cast<size_t>(c.P);
    EXPECT_NEAR(aux[r], want_aux[x], loss_tolerance(c.precision) * std::abs(want_aux[x])) << "rank " << r;
    EXPECT_EQ(routed[r], want_routed[x]) << "rank " << r;
  }
  double worst = 0.0;  // the largest |difference| / max |gradient| of a unit, reported
  int compared = 0;
  for (size_t u = 0; u < reference.front().grads.size(); ++u) {
    if (!layout.units[u].trainable) continue;  // a LoRA run's frozen base: no gradient
    ++compared;
    double max_abs = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < reference.front().grads[u].size(); ++i) {
      double sum = 0.0, want = 0.0;  // the ranks' partial gradients, as the strategy's reduction adds them
      for (const Weights& w : per_rank) sum += w.grads[u][i];
      for (const Weights& w : reference) want += w.grads[u][i];
      max_abs = std::max(max_abs, std::abs(want));
      max_diff = std::max(max_diff, std::abs(sum - want));
    }
    if (max_abs == 0.0 && config.moe.enabled()) {  // an expert no token of the rows reached
      EXPECT_EQ(max_diff, 0.0) << "flat unit " << u;
      continue;
    }
    ASSERT_GT(max_abs, 0.0) << "flat unit " << u;
    worst = std::max(worst, max_diff / max_abs);
    EXPECT_LE(max_diff, gradient_tolerance(c.precision) * max_abs)
        << "flat unit " << u << ": max |diff| " << max_diff << " of max |grad| " << max_abs;
  }
  EXPECT_GT(compared, 0);
  std::printf("%s %s P=%d E=%d%s %s: loss rel diff %.1e, %d units' gradients within %.1e of each unit's largest\n",
              c.preset.c_str(), kind.c_str(), c.P, c.E, c.experts_span_context ? " (over the context ranks)" : "",
              variant.c_str(), std::abs(loss - want_loss) / std::abs(want_loss),
              compared, worst);
}

TEST(ContextParallel, UlyssesSplitsKvHeadsLikeOneRank) {
  // llama-tiny and qwen2-tiny: 4 query heads, 2 KV heads; P = 2 gives each rank one KV head.
  for (const char* preset : {"llama-tiny", "qwen2-tiny"})
    for (bool packed : {false, true}) expect_context_parallel_matches({preset, 2, packed, false});
  expect_context_parallel_matches({"llama-tiny", 2, true, true});
}

TEST(ContextParallel, UlyssesReplicatesKvHeadsLikeOneRank) {
  // P = 4 over 2 KV heads, and qwen3-tiny's 3 query heads over one KV head at P = 3.
  expect_context_parallel_matches({"llama-tiny", 4, true, false});
  expect_context_parallel_matches({"qwen3-tiny", 3, false, false});
  expect_context_parallel_matches({"qwen3-tiny", 3, true, true});
}

TEST(ContextParallel, RingMatchesOneRank) {
  const ContextParallelKind ring = ContextParallelKind::ring;
  for (const char* preset : {"llama-tiny", "qwen2-tiny", "qwen3-tiny"})
    for (int P : {2, 4})
      for (bool packed : {false, true}) expect_context_parallel_matches({preset, P, packed, false, ring});
  // qwen3-tiny's 3 query heads, which Ulysses cannot split over 2 or 4, and an odd P.
  expect_context_parallel_matches({"qwen3-tiny", 3, true, false, ring});
  expect_context_parallel_matches({"llama-tiny", 4, true, true, ring});
}

TEST(ContextParallel, HybridMatchesOneRank) {
  // P = 4 in Ulysses groups of U = 2 (each rank one of the 2 KV heads) and a ring of 2
  // across them; packed documents of 11 and 13 tokens cross the zigzag chunks of 6.
  const ContextParallelKind hybrid = ContextParallelKind::hybrid;
  for (const char* preset : {"llama-tiny", "qwen2-tiny"})
    for (bool packed : {false, true}) expect_context_parallel_matches({preset, 4, packed, false, hybrid, 2});
  expect_context_parallel_matches({"llama-tiny", 4, true, true, hybrid, 2});
}

TEST(ContextParallel, Gpt2MatchesOneRank) {
  // gpt2-tiny's 2 heads (4 for Ulysses at P = 4); packed documents of 11 and 13 tokens
  // restart their positions, so the wpe rows read are not the tokens' row indices.
  for (bool packed : {false, true}) {
    expect_context_parallel_matches({"gpt2-tiny", 2, packed, false});
    expect_context_parallel_matches({"gpt2-tiny", 2, packed, false, ContextParallelKind::ring});
    expect_context_parallel_matches({"gpt2-tiny", 4, packed, false, ContextParallelKind::ring});
    expect_context_parallel_matches({"gpt2-tiny", 4, packed, false, ContextParallelKind::hybrid, 2});
  }
  expect_context_parallel_matches({"gpt2-tiny", 4, true, false, ContextParallelKind::ulysses, 1, 4});
  expect_context_parallel_matches({"gpt2-tiny", 4, true, true, ContextParallelKind::ring});
  expect_context_parallel_matches({"gpt2-tiny", 4, true, true, ContextParallelKind::hybrid, 2});
}

TEST(ContextParallel, Gpt2InBf16MatchesOneBf16Rank) {
  // The three kinds in bf16 (the reference: one rank in bf16 on whole rows), packed
  // rows, P = 2 for Ulysses (gpt2-tiny's 2 heads) and the ring, P = 4 U = 2 for hybrid
  // with activation checkpointing (its recompute in bf16 too).
  Case ulysses{"gpt2-tiny", 2, true, false}, ring{"gpt2-tiny", 2, true, false, ContextParallelKind::ring},
      hybrid{"gpt2-tiny", 4, true, true, ContextParallelKind::hybrid, 2};
  for (Case* c : {&ulysses, &ring, &hybrid}) {
    c->precision = DType::bf16;
    expect_context_parallel_matches(*c);
  }
}

TEST(ContextParallel, LoraOfTheExpertsMatchesOneRank) {
  // Adapters on the attention and every routed expert's fused gate_up and down
  // projections: only they train, each rank's adapter gradients over its own tokens
  // (the experts see the tokens the rank routes), summed over the group.
  const std::vector<std::string> targets{"q_proj", "experts.gate_up_proj", "experts.down_proj"};
  Case qwen3{"qwen3-moe-tiny", 2, true, false, ContextParallelKind::ulysses, 1, 0, 1.0},
      mixtral{"mixtral-tiny", 4, true, true, ContextParallelKind::ring, 1, 0, 1.0},
      experts_only{"qwen2-moe-tiny", 4, false, false, ContextParallelKind::hybrid, 2, 0, 1.0};
  qwen3.lora_targets = mixtral.lora_targets = targets;
  experts_only.lora_targets = {"experts.gate_up_proj", "experts.down_proj"};
  for (const Case& c : {qwen3, mixtral, experts_only}) expect_context_parallel_matches(c);
}

TEST(ContextParallel, MixturesOfExpertsMatchOneRank) {
  // The load-balancing loss over the whole rows (its sums added over the group) at a
  // coefficient of 1, so that its router gradient weighs as much as the loss's: with
  // each rank's own sums the router's gradient (and the loss) would be off.
  const ContextParallelKind ring = ContextParallelKind::ring, hybrid = ContextParallelKind::hybrid;
  for (bool packed : {false, true}) {
    expect_context_parallel_matches({"qwen3-moe-tiny", 2, packed, false, ContextParallelKind::ulysses, 1, 0, 1.0});
    expect_context_parallel_matches({"qwen2-moe-tiny", 4, packed, false, ring, 1, 0, 1.0});
  }
  expect_context_parallel_matches({"mixtral-tiny", 4, true, false, hybrid, 2, 0, 1.0});
  expect_context_parallel_matches({"qwen3-moe-tiny", 4, true, true, ring, 1, 0, 1.0});
}

TEST(ContextParallel, ExpertParallelismWithTheContextRanksMatchesOneRank) {
  // E = 2 expert ranks x P = 2 (hybrid: 4) context ranks: each context rank routes its
  // own tokens to the holders at its context coordinate; against one rank per expert
  // coordinate's rows (with activation checkpointing too: the held rows sent again in
  // backward).
  const ContextParallelKind ring = ContextParallelKind::ring, ulysses = ContextParallelKind::ulysses;
  Case cases[] = {{"qwen3-moe-tiny", 2, false, false, ulysses, 1, 0, 1.0},
                  {"mixtral-tiny", 2, true, false, ring, 1, 0, 1.0},
                  {"qwen2-moe-tiny", 2, true, true, ring, 1, 0, 1.0},
                  {"mixtral-tiny", 4, true, false, ContextParallelKind::hybrid, 2, 0, 1.0}};
  for (Case& c : cases) {
    c.E = 2;
    expect_context_parallel_matches(c);
  }
}

TEST(ContextParallel, AnExpertGroupSpanningTheContextRanksMatchesOneRank) {
  // E > the data-parallel ranks: the expert group is expert x context (E = N: N=2 P=2
  // E=2, one data coordinate; N=4 P=2 E=4, two), a context rank's tokens reaching
  // experts held by the other context ranks of its rows and by the other rows' ranks.
  const ContextParallelKind ring = ContextParallelKind::ring, ulysses = ContextParallelKind::ulysses;
  Case cases[] = {{"qwen3-moe-tiny", 2, false, false, ulysses, 1, 0, 1.0},
                  {"mixtral-tiny", 2, true, true, ring, 1, 0, 1.0},
                  {"qwen2-moe-tiny", 2, true, false, ring, 1, 0, 1.0}};
  cases[0].E = 2;
  cases[1].E = 4;
  cases[2].E = 4;
  for (Case& c : cases) {
    c.experts_span_context = true;
    expect_context_parallel_matches(c);
  }
}

// A rank whose message never arrives: the other ranks' waits run into the deadline, and
// the error names the exchange (the contribution is lost on its way, InProcessFault).
std::vector<std::string> errors_when_lost(ContextParallelKind kind, const std::string& label) {
  const ModelConfig config = tiny_family_config("llama-tiny");
  const int B = 1, T = 24;
  const ParamLayout layout = ParamLayout::build(config, 1, 0);
  const Rows rows = make_rows(B, T, config.vocab_size);
  InProcessJob job(2, CommOptions{.timeout_seconds = 0.2});
  job.inject({.rank = 1, .label = label});
  return job.run([&](Communicator& world) {
    ModelOptions o;
    o.parallel_groups.context = &world;
    o.context_parallel_kind = kind;
    auto model = model_family(config.family).make_model(config, layout, B, T, o, MemoryTracker::global());
    Weights w(*model, layout);
    run(*model, w, rows.batch(B, T, false));
  });
}

TEST(ContextParallel, ALostRingBlockOrAllToAllRunsIntoTheDeadlineNamingIt) {
  const auto ring = errors_when_lost(ContextParallelKind::ring, "ring k|v");
  for (const std::string& e : ring)
    EXPECT_NE(e.find("timed out after 0.2 s waiting for send_recv 'ring k|v'"), std::string::npos) << e;
  const auto ulysses = errors_when_lost(ContextParallelKind::ulysses, "ulysses q|k|v");
  for (const std::string& e : ulysses)
    EXPECT_NE(e.find("timed out after 0.2 s waiting for all_to_all 'ulysses q|k|v'"), std::string::npos) << e;
}

TEST(ContextParallel, HeadsThatDoNotSplitAreOneLineErrors) {
  auto error_of = [](int P, ContextHeads h) {
    try {
      check_context_heads(P, h);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of(2, {4, 2, 24}), "");
  EXPECT_EQ(error_of(4, {4, 2, 24}), "");
  EXPECT_EQ(error_of(2, {3, 1, 40}),
            "--context-parallel 2 (ulysses) splits the attention heads over the ranks: the "
            "model's 3 query heads do not divide by 2");
  EXPECT_NE(error_of(4, {12, 3, 24}).find("the model's 3 key/value heads neither divide by 4"),
            std::string::npos);
  ContextSplit split(0, 4, false);
  try {
    split.check_seq_len(30);
    ADD_FAILURE() << "30 tokens split over 4 ranks";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "--seq-len 30 does not split over --context-parallel 4: the split needs a multiple of 4");
  }
  try {
    ContextSplit(1, 4, true).check_seq_len(36);
    ADD_FAILURE() << "36 tokens split into 8 zigzag chunks";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "--seq-len 36 does not split over --context-parallel 4: ring attention's zigzag "
              "split needs a multiple of 8 (2 chunks per rank)");
  }
}

TEST(ContextParallel, HybridRefusesWhatItCannotSplit) {
  auto error_of = [](const std::string& preset, int P, ContextParallelKind kind, int U) {
    try {
      check_context_parallel_model(tiny_family_config(preset), P, kind, /*tensor_size=*/1, U);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const ContextParallelKind hybrid = ContextParallelKind::hybrid;
  EXPECT_EQ(error_of("llama-tiny", 4, hybrid, 2), "");
  EXPECT_EQ(error_of("llama-tiny", 6, hybrid, 3),
            "--ulysses-degree 3 (hybrid) splits the attention heads over each Ulysses group: "
            "the model's 4 query heads do not divide by 3");
  EXPECT_EQ(error_of("qwen3-tiny", 4, hybrid, 2),
            "--ulysses-degree 2 (hybrid) splits the attention heads over each Ulysses group: "
            "the model's 3 query heads do not divide by 2");
  EXPECT_EQ(error_of("llama-tiny", 4, hybrid, 3),
            "--context-parallel 4 --context-parallel-kind hybrid needs --ulysses-degree U with "
            "1 < U < 4 dividing 4 (Ulysses inside groups of U, ring across 4 / U), got 3");
  EXPECT_EQ(error_of("llama-tiny", 4, hybrid, 4),
            "--context-parallel 4 --context-parallel-kind hybrid needs --ulysses-degree U with "
            "1 < U < 4 dividing 4 (Ulysses inside groups of U, ring across 4 / U), got 4");
  try {
    check_ulysses_degree(4, ContextParallelKind::ring, 2);
    ADD_FAILURE() << "--ulysses-degree with ring";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "--ulysses-degree 2 needs --context-parallel-kind hybrid (got ring): it sizes "
              "hybrid's Ulysses groups");
  }
  try {
    ContextSplit(0, 4, true, 2).check_seq_len(18);
    ADD_FAILURE() << "18 tokens into 4 zigzag chunks";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "--seq-len 18 does not split over --context-parallel 4 (hybrid, --ulysses-degree "
              "2): 4 zigzag chunks of 2 equal parts need a multiple of 4");
  }
}

TEST(ContextParallel, HybridSplitIsZigzagOverTheUlyssesGroups) {
  // T = 16, P = 4, U = 2: 2 groups, chunks of 4; group 0 (ranks 0, 1) holds chunks 0 and 3,
  // group 1 (ranks 2, 3) chunks 1 and 2, each rank a contiguous half of its group's tokens.
  std::vector<std::vector<int>> held(4);
  for (int r = 0; r < 4; ++r) {
    const ContextSplit split(r, 4, true, 2);
    EXPECT_EQ(split.chunks_per_row(), 4);
    for (int i = 0; i < 4; ++i) held[static_cast<size_t>(r)].push_back(split.global_index(16, i));
  }
  EXPECT_EQ(held[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(held[1], (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(held[2], (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(held[3], (std::vector<int>{8, 9, 10, 11}));
}

TEST(ContextParallel, ZigzagSplitHoldsChunksRAnd2PMinus1MinusR) {
  // T = 16 over P = 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const ContextSplit r0(0, 2, true), r1(1, 2, true);
  std::vector<int> held0, held1;
  for (int i = 0; i < 8; ++i) held0.push_back(r0.global_index(16, i)), held1.push_back(r1.global_index(16, i));
  EXPECT_EQ(held0, (std::vector<int>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(held1, (std::vector<int>{4, 5, 6, 7, 8, 9, 10, 11}));
}

}  // namespace
}  // namespace shardlm
