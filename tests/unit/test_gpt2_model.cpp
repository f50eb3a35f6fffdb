// Gpt2Model behaviour beyond the numbers of the PyTorch fixture: deterministic init
// independent of world size, the untied LM head against the tied one, tracked
// activation memory, and clear errors on misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"

namespace {

shardlm::ModelConfig small_config(bool tied = true) {
  shardlm::ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 67;
  c.max_seq_len = 16;
  c.tie_embeddings = tied;
  return c;
}

struct Buffers {
  std::vector<std::vector<float>> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;
  Buffers(const shardlm::Gpt2Model& model, uint64_t seed) {
    const shardlm::ParamLayout& layout = model.layout();
    for (int u = 0; u < layout.num_units(); ++u) {
      params.emplace_back(layout.units[u].padded_numel, -1.0f);  // init must overwrite it all
      grads.emplace_back(layout.units[u].padded_numel, 0.0f);
      model.init_unit(u, seed, params.back().data());
    }
    for (const auto& place : layout.model_units) {  // the model takes model-unit pointers
      param_ptrs.push_back(params[place.unit].data() + place.base);
      grad_ptrs.push_back(grads[place.unit].data() + place.base);
    }
  }
  std::vector<float> param(const shardlm::ParamLayout& layout, const std::string& name) const {
    auto [u, p] = layout.find(name);
    return {params[u].begin() + p->offset, params[u].begin() + p->offset + p->numel};
  }
  std::vector<float> grad(const shardlm::ParamLayout& layout, const std::string& name) const {
    auto [u, p] = layout.find(name);
    return {grads[u].begin() + p->offset, grads[u].begin() + p->offset + p->numel};
  }
};

struct Batch {
  std::vector<int32_t> tokens, targets;
  int B, T;
  Batch(int b, int t, int vocab, uint64_t seed) : B(b), T(t) {
    shardlm::Rng rng(seed);
    for (int i = 0; i < B * T; ++i) {
      tokens.push_back(static_cast<int32_t>(rng.below(vocab)));
      targets.push_back(i % 5 == 2 ? shardlm::kIgnoreIndex : static_cast<int32_t>(rng.below(vocab)));
    }
  }
  shardlm::MicroBatch micro() const { return {tokens.data(), targets.data(), B, T}; }
};

void train_step(shardlm::Gpt2Model& model, Buffers& buf, const shardlm::MicroBatch& batch,
                float scale) {
  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, buf.param_ptrs, buf.grad_ptrs, batch, true, scale);
  for (int u = model.num_units() - 1; u >= 0; --u)
    model.backward_unit(u, buf.param_ptrs, buf.grad_ptrs, batch);
}

TEST(Gpt2Model, InitDependsOnSeedAndNameOnlyNotWorldSizeOrMerging) {
  const auto config = small_config();
  const auto layout1 = shardlm::ParamLayout::build(config, 1);
  const auto layout3 = shardlm::ParamLayout::build(config, 3);
  const auto merged = shardlm::ParamLayout::build(config, 3, 3000);  // 2 flat units
  ASSERT_LT(merged.num_units(), layout1.num_units());
  shardlm::Gpt2Model model1(config, layout1, 1, 4), model3(config, layout3, 1, 4),
      model_merged(config, merged, 1, 4);
  const Buffers a(model1, 7), b(model3, 7), c(model_merged, 7), other_seed(model1, 8);
  for (const auto* p : layout1.all_params()) {
    EXPECT_EQ(a.param(layout1, p->name), b.param(layout3, p->name)) << p->name;
    EXPECT_EQ(a.param(layout1, p->name), c.param(merged, p->name)) << p->name;
    if (p->init == shardlm::ParamInit::normal) {
      EXPECT_NE(a.param(layout1, p->name), other_seed.param(layout1, p->name)) << p->name;
    }
  }
  // Everything outside a parameter's real rows is zero; ones/zeros/normal as declared.
  for (int u = 0; u < layout1.num_units(); ++u) {
    std::vector<bool> covered(layout1.units[u].padded_numel, false);
    for (const auto& p : layout1.units[u].params) {
      const int64_t real = p.valid_rows < 0 ? p.numel : p.valid_rows * p.shape[1];
      for (int64_t i = 0; i < p.numel; ++i) {
        const float v = a.params[u][p.offset + i];
        covered[p.offset + i] = true;
        const float expected = i >= real ? 0.0f : p.init == shardlm::ParamInit::ones ? 1.0f : p.init == shardlm::ParamInit::zeros ? 0.0f : v;
        EXPECT_EQ(v, expected) << p.name << " element " << i;
      }
    }
    for (size_t i = 0; i < covered.size(); ++i)
      if (!covered[i]) {
        EXPECT_EQ(a.params[u][i], 0.0f) << "unit " << u << " padding " << i;
      }
  }
}

// A rank fills only its owned slice (init_range): every slice, including ones that
// cut parameters and padding anywhere, must be bitwise that part of the whole unit.
TEST(Gpt2Model, InitRangeIsBitwiseTheSliceOfTheWholeUnit) {
  const auto config = small_config();
  const auto layout = shardlm::ParamLayout::build(config, 1, 3000);  // merged units
  shardlm::Gpt2Model model(config, layout, 1, 4);
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t P = layout.units[u].padded_numel;
    std::vector<float> whole(P);
    model.init_unit(u, 7, whole.data());
    for (int64_t begin : {int64_t{0}, int64_t{1}, P / 3, P / 2 + 5, P - 1, P}) {
      for (int64_t end : {begin, begin + 1, (begin + P) / 2 + 3, P}) {
        if (end > P) continue;
        std::vector<float> slice(end - begin + 1, -1.0f);
        model.init_range(u, 7, begin, end, slice.data());
        for (int64_t i = begin; i < end; ++i)
          ASSERT_EQ(slice[i - begin], whole[i]) << "unit " << u << " [" << begin << ", " << end
                                                << ") element " << i;
        EXPECT_EQ(slice[end - begin], -1.0f) << "wrote past the range";
      }
    }
  }
  std::vector<float> out(4);
  EXPECT_THROW(model.init_range(0, 7, 3, 2, out.data()), shardlm::Error);
  EXPECT_THROW(model.init_range(0, 7, 0, layout.units[0].padded_numel + 1, out.data()),
               shardlm::Error);
}

TEST(Gpt2Model, InitStandardDeviationsFollowGpt2) {
  auto config = small_config();
  config.n_embd = 64;
  config.n_head = 4;
  config.n_layer = 3;
  const auto layout = shardlm::ParamLayout::build(config, 1);
  shardlm::Gpt2Model model(config, layout, 1, 4);
  const Buffers buf(model, 1);
  auto stddev = [](const std::vector<float>& v, size_t count) {
    double s = 0.0, s2 = 0.0;
    for (size_t i = 0; i < count; ++i) s += v[i], s2 += double(v[i]) * v[i];
    const double m = s / count;
    return std::sqrt(s2 / count - m * m);
  };
  const auto c_fc = buf.param(layout, "transformer.h.1.mlp.c_fc.weight");  // 16384 values
  EXPECT_NEAR(stddev(c_fc, c_fc.size()), 0.02, 0.02 * 0.03);
  const auto c_proj = buf.param(layout, "transformer.h.1.mlp.c_proj.weight");
  EXPECT_NEAR(stddev(c_proj, c_proj.size()), 0.02 / std::sqrt(6.0), 0.02 / std::sqrt(6.0) * 0.03);
  const auto wte = buf.param(layout, "transformer.wte.weight");
  EXPECT_NEAR(stddev(wte, 67 * 64), 0.02, 0.02 * 0.05);
}

TEST(Gpt2Model, UntiedHeadMatchesTiedHeadWithCopiedWeights) {
  const auto tied_config = small_config(true), untied_config = small_config(false);
  const auto tied_layout = shardlm::ParamLayout::build(tied_config, 1);
  const auto untied_layout = shardlm::ParamLayout::build(untied_config, 1);
  shardlm::Gpt2Model tied(tied_config, tied_layout, 2, 9), untied(untied_config, untied_layout, 2, 9);
  EXPECT_EQ(tied.units_needed_for(tied.num_units() - 1), (std::vector<int>{0, 3}));
  EXPECT_EQ(untied.units_needed_for(untied.num_units() - 1), (std::vector<int>{3}));
  Buffers t(tied, 5), u(untied, 5);
  // Same weights everywhere; the untied head starts as a copy of wte.
  const auto wte = t.param(tied_layout, "transformer.wte.weight");
  auto [head_unit, head] = untied_layout.find("lm_head.weight");
  std::copy(wte.begin(), wte.end(), u.params[head_unit].begin() + head->offset);

  const Batch batch(2, 9, tied_config.vocab_size, 3);
  train_step(tied, t, batch.micro(), 0.1f);
  train_step(untied, u, batch.micro(), 0.1f);
  EXPECT_NEAR(untied.last_loss_sum(), tied.last_loss_sum(), 1e-6 * tied.last_loss_sum());
  // The tied gradient is the sum of the embedding's and the head's.
  auto untied_sum = u.grad(untied_layout, "transformer.wte.weight");
  const auto head_grad = u.grad(untied_layout, "lm_head.weight");
  for (size_t i = 0; i < untied_sum.size(); ++i) untied_sum[i] += head_grad[i];
  const auto tied_grad = t.grad(tied_layout, "transformer.wte.weight");
  double max_ref = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < tied_grad.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double(tied_grad[i])));
    max_diff = std::max(max_diff, std::fabs(double(tied_grad[i]) - untied_sum[i]));
  }
  EXPECT_LT(max_diff, 1e-5 * max_ref);
  EXPECT_GT(max_ref, 0.0);
}

TEST(Gpt2Model, ActivationsAreTrackedAndReleased) {
  shardlm::MemoryTracker tracker;
  const auto config = small_config();
  const auto layout = shardlm::ParamLayout::build(config, 1);
  {
    shardlm::Gpt2Model model(config, layout, 3, 16, tracker);
    // At least the residual stream of every unit boundary and the MLP activations.
    const size_t N = 3 * 16, C = 16;
    EXPECT_GT(tracker.current(shardlm::MemCategory::activations),
              (config.n_layer + 1 + config.n_layer * 8) * N * C * sizeof(float));
  }
  EXPECT_EQ(tracker.current(shardlm::MemCategory::activations), 0u);
}

template <typename F>
void expect_error_containing(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << what << "'";
  } catch (const shardlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Gpt2Model, MisuseGivesClearErrors) {
  const auto config = small_config();
  const auto layout = shardlm::ParamLayout::build(config, 1);
  EXPECT_THROW(shardlm::Gpt2Model(config, layout, 1, 17), shardlm::Error);  // > max_seq_len
  shardlm::Gpt2Model model(config, layout, 2, 8);
  Buffers buf(model, 1);
  Batch batch(2, 8, config.vocab_size, 9);

  expect_error_containing([&] { model.backward_unit(3, buf.param_ptrs, buf.grad_ptrs, batch.micro()); },
                          "without a training forward");
  Batch too_long(2, 9, config.vocab_size, 9);
  expect_error_containing(
      [&] { model.forward_unit(0, buf.param_ptrs, buf.grad_ptrs, too_long.micro(), true, 1.0f); },
      "sequence length 9");
  Batch bad_token = batch;
  bad_token.tokens[5] = config.vocab_size;
  expect_error_containing(
      [&] { model.forward_unit(0, buf.param_ptrs, buf.grad_ptrs, bad_token.micro(), true, 1.0f); },
      "outside the vocabulary");
  Batch bad_target = batch;
  bad_target.targets[3] = -2;
  expect_error_containing(
      [&] {
        for (int u = 0; u < model.num_units(); ++u)
          model.forward_unit(u, buf.param_ptrs, buf.grad_ptrs, bad_target.micro(), true, 1.0f);
      },
      "target -2");

  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, buf.param_ptrs, buf.grad_ptrs, batch.micro(), true, 1.0f);
  expect_error_containing([&] { model.backward_unit(1, buf.param_ptrs, buf.grad_ptrs, batch.micro()); },
                          "out of order");
  std::vector<float*> missing = buf.grad_ptrs;
  missing[3] = nullptr;
  expect_error_containing([&] { model.backward_unit(3, buf.param_ptrs, missing, batch.micro()); },
                          "grads of unit 3 is null");
  expect_error_containing([&] { model.logits_at(buf.param_ptrs, 8, nullptr); }, "position 8");
}

}  // namespace
