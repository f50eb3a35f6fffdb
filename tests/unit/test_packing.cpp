// Packed sequences and loss masks, for every family: a row holding several examples
// (positions restarting per example, attention bounded by key_begin, padding after
// them) gives the same loss and every gradient as the examples run one at a time, and
// a masked target contributes no loss and no gradient. The references are plain
// unpacked micro-batches (no positions, no key_begin), so a leak across an example
// boundary, a position that does not restart or a masked target that counts shows up
// as a difference.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/model.hpp"
#include "tiny_family_config.hpp"

namespace shardlm {
namespace {

// fp32 parameters and zeroed gradients, one buffer per flat unit.
struct Weights {
  std::vector<std::vector<float>> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;
  Weights(const Model& model, const ParamLayout& layout) {
    for (int u = 0; u < layout.num_units(); ++u) {
      params.emplace_back(layout.units[static_cast<size_t>(u)].padded_numel, 0.0f);
      grads.emplace_back(layout.units[static_cast<size_t>(u)].padded_numel, 0.0f);
      model.init_unit(u, 7, params.back().data());
      // Zero-initialised tensors (LoRA B, biases) would hide terms: perturb everything.
      Rng rng(100 + static_cast<uint64_t>(u));
      for (float& p : params.back()) p += 0.02f * (static_cast<float>(rng.uniform()) - 0.5f);
    }
    for (const auto& place : layout.model_units) {
      param_ptrs.push_back(params[static_cast<size_t>(place.unit)].data() + place.base);
      grad_ptrs.push_back(grads[static_cast<size_t>(place.unit)].data() + place.base);
    }
  }
  void zero_grads() {
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
  }
};

// Forward and backward of one micro-batch (gradients accumulate); returns the loss sum.
double run(Model& model, Weights& w, const MicroBatch& batch) {
  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, w.param_ptrs, w.grad_ptrs, batch, true, 1.0f);
  for (int u = model.num_units() - 1; u >= 0; --u) model.backward_unit(u, w.param_ptrs, w.grad_ptrs, batch);
  return model.last_loss_sum();
}

struct Example {
  std::vector<int32_t> tokens, targets;
};

Example random_example(int length, uint64_t seed, int vocab) {
  Rng rng(seed);
  Example e;
  for (int t = 0; t < length; ++t) {
    e.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    // A prompt (first third masked), then targets.
    e.targets.push_back(t < length / 3 ? kIgnoreIndex
                                       : static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  }
  return e;
}

void expect_close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t u = 0; u < got.size(); ++u) {
    double max_abs = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < got[u].size(); ++i) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(want[u][i])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(got[u][i]) - want[u][i]));
    }
    ASSERT_GT(max_abs, 0.0) << what << ": flat unit " << u << " has an all-zero gradient";
    EXPECT_LE(max_diff, 2e-5 * max_abs) << what << ": flat unit " << u;
  }
}

class Packing : public ::testing::TestWithParam<std::string> {};

TEST_P(Packing, PackedRowEqualsItsExamplesRunOneAtATime) {
  const ModelConfig config = tiny_family_config(GetParam());
  const ParamLayout layout = ParamLayout::build(config, 1);
  const int T = 24;
  auto model = model_family(config.family).make_model(config, layout, 2, T, {}, MemoryTracker::global());
  Weights w(*model, layout);

  const std::vector<Example> examples = {random_example(7, 1, config.vocab_size),
                                         random_example(11, 2, config.vocab_size),
                                         random_example(3, 3, config.vocab_size)};
  // One at a time: each example is its own micro-batch of one row.
  double want_loss = 0.0;
  int64_t want_count = 0;
  for (const Example& e : examples) {
    const MicroBatch alone{e.tokens.data(), e.targets.data(), 1, static_cast<int>(e.tokens.size())};
    want_loss += run(*model, w, alone);
    want_count += model->last_target_count();
  }
  const auto want_grads = w.grads;

  // Packed: row 0 holds examples 0 and 1 and 6 tokens of padding; row 1 holds example
  // 2 and padding (padding attends only to itself and has no targets).
  std::vector<int32_t> tokens, targets, positions, key_begin;
  auto append = [&](const Example& e, int row_start) {
    const int begin = static_cast<int>(tokens.size()) - row_start;
    for (size_t t = 0; t < e.tokens.size(); ++t) {
      tokens.push_back(e.tokens[t]);
      targets.push_back(e.targets[t]);
      positions.push_back(static_cast<int32_t>(t));
      key_begin.push_back(begin);
    }
  };
  auto pad_to = [&](int row_end, int row_start) {
    const int begin = static_cast<int>(tokens.size()) - row_start;
    for (int p = 0; static_cast<int>(tokens.size()) < row_end; ++p) {
      tokens.push_back(5);
      targets.push_back(kIgnoreIndex);
      positions.push_back(p);
      key_begin.push_back(begin);
    }
  };
  append(examples[0], 0);
  append(examples[1], 0);
  pad_to(T, 0);
  append(examples[2], T);
  pad_to(2 * T, T);
  const MicroBatch packed{tokens.data(), targets.data(), 2, T, positions.data(), key_begin.data()};
  w.zero_grads();
  const double got_loss = run(*model, w, packed);
  EXPECT_EQ(model->last_target_count(), want_count);
  EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss);
  expect_close(w.grads, want_grads, "packed vs one at a time");

  // Without key_begin the second example would see the first: the check above is not
  // vacuous.
  const MicroBatch leaky{tokens.data(), targets.data(), 2, T, positions.data(), nullptr};
  w.zero_grads();
  EXPECT_GT(std::abs(run(*model, w, leaky) - want_loss), 1e-4 * want_loss);
  // GPT-2's learned positions must restart too (RoPE only sees relative positions, so
  // for Llama and Qwen offsets within an example change nothing).
  if (config.family == "gpt2") {
    const MicroBatch unrestarted{tokens.data(), targets.data(), 2, T, nullptr, key_begin.data()};
    w.zero_grads();
    EXPECT_GT(std::abs(run(*model, w, unrestarted) - want_loss), 1e-4 * want_loss);
  }
}

TEST_P(Packing, MaskedTargetsContributeNoLossAndNoGradient) {
  const ModelConfig config = tiny_family_config(GetParam());
  const ParamLayout layout = ParamLayout::build(config, 1);
  const int B = 2, T = 16;
  auto model = model_family(config.family).make_model(config, layout, B, T, {}, MemoryTracker::global());
  Weights w(*model, layout);
  Rng rng(11);
  std::vector<int32_t> tokens, all, first_half, second_half;
  for (int i = 0; i < B * T; ++i) {
    tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))));
    all.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))));
    // Two complementary masks, interleaved irregularly.
    const bool in_first = (i * 7) % 5 < 2;
    first_half.push_back(in_first ? all.back() : kIgnoreIndex);
    second_half.push_back(in_first ? kIgnoreIndex : all.back());
  }
  const double loss_all = run(*model, w, {tokens.data(), all.data(), B, T});
  const auto grads_all = w.grads;
  w.zero_grads();
  double loss_parts = run(*model, w, {tokens.data(), first_half.data(), B, T});
  const int64_t count_first = model->last_target_count();
  loss_parts += run(*model, w, {tokens.data(), second_half.data(), B, T});
  EXPECT_EQ(count_first + model->last_target_count(), B * T);
  // The loss and gradient of a mask are exactly the terms of its unmasked targets.
  EXPECT_NEAR(loss_parts, loss_all, 1e-5 * loss_all);
  expect_close(w.grads, grads_all, "two complementary masks vs none");

  // Everything masked: no loss, no gradient at all.
  std::vector<int32_t> none(tokens.size(), kIgnoreIndex);
  w.zero_grads();
  EXPECT_EQ(run(*model, w, {tokens.data(), none.data(), B, T}), 0.0);
  EXPECT_EQ(model->last_target_count(), 0);
  for (const auto& g : w.grads)
    for (float v : g) ASSERT_EQ(v, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Families, Packing, ::testing::Values("gpt2-tiny", "llama-tiny", "qwen2-tiny", "qwen3-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace shardlm
