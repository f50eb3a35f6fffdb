// The Llama-family model (llama, qwen2, qwen3) against Hugging Face transformers' own
// models in float64 (tools/make_llama_fixture.py): loss, logits at every position,
// every parameter gradient, and three AdamW steps with clipping through the real
// strategy and optimizer; then the same numbers must not change with the world size's
// padding, merged units, micro-batch accumulation or activation checkpointing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llama_fixture_support.hpp"
#include "relative_error.hpp"
#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

namespace st = shardlm::safetensors;
using namespace shardlm;

namespace {

using namespace shardlm::testing;

class LlamaFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaFixture, LossLogitsAndGradientsMatchTransformers) {
  const Reference ref = load_reference(GetParam());
  const auto layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  UnitBuffers buf(layout, ref.file);
  ASSERT_GT(ref.count, 0);
  ASSERT_LT(ref.count, ref.B * ref.T);  // some targets are ignored
  const MicroBatch batch{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
  train_micro_batch(*model, buf, batch, 1.0f / static_cast<float>(ref.count));

  EXPECT_EQ(model->last_target_count(), ref.count);
  const double loss = model->last_loss_sum() / static_cast<double>(ref.count);
  const double want_loss = ref.file.at("loss").to_f32()[0];
  EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
  for (const auto* p : layout.all_params()) {
    EXPECT_LT(relative_to_max_error(buf.grad(layout, p->name), ref.file.at(p->name + ".grad").to_f32()),
              1e-5)
        << p->name;
  }
  // Padding (alignment gaps, unit tails, padded vocabulary rows) gets no gradient.
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<bool> is_param(layout.units[u].padded_numel, false);
    for (const auto& p : layout.units[u].params) {
      const int64_t real = p.valid_rows < 0 ? p.numel : p.valid_rows * p.shape[1];
      std::fill(is_param.begin() + p.offset, is_param.begin() + p.offset + real, true);
    }
    for (int64_t i = 0; i < layout.units[u].padded_numel; ++i) {
      if (!is_param[i]) {
        ASSERT_EQ(buf.grads[u][i], 0.0f) << "unit " << u << " element " << i;
      }
    }
  }

  // Logits at every position, through the sampling path.
  const MicroBatch sample{ref.tokens.data(), nullptr, ref.B, ref.T};
  for (int u = 0; u < model->num_units(); ++u) model->forward_unit(u, buf.param_ptrs, {}, sample, false, 1.0f);
  const auto want = ref.file.at("logits").to_f32();  // [B, T, V]
  const size_t V = static_cast<size_t>(ref.config.vocab_size);
  std::vector<float> got(want.size()), at_t(static_cast<size_t>(ref.B) * V);
  for (int t = 0; t < ref.T; ++t) {
    model->logits_at(buf.param_ptrs, t, at_t.data());
    for (int b = 0; b < ref.B; ++b)
      std::copy_n(at_t.begin() + static_cast<long>(b * V), V,
                  got.begin() + static_cast<long>((static_cast<size_t>(b) * ref.T + t) * V));
  }
  EXPECT_LT(relative_to_max_error(got, want), 1e-5);
}

TEST_P(LlamaFixture, PaddingMergedUnitsAccumulationAndCheckpointingChangeNoBit) {
  const Reference ref = load_reference(GetParam());
  const float scale = 1.0f / static_cast<float>(ref.count);
  const MicroBatch batch{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
  const auto layout1 = ParamLayout::build(ref.config, 1);
  auto model1 = make_model(ref, layout1, ref.B);
  UnitBuffers buf1(layout1, ref.file);
  train_micro_batch(*model1, buf1, batch, scale);

  const auto layout3 = ParamLayout::build(ref.config, 3);
  const auto merged = ParamLayout::build(ref.config, 3, 60000);
  ASSERT_LT(merged.num_units(), layout1.num_units());
  for (const ParamLayout* other : {&layout3, &merged}) {
    for (const bool checkpointing : {false, true}) {
      auto model = make_model(ref, *other, ref.B, {DType::fp32, checkpointing});
      UnitBuffers buf(*other, ref.file);
      train_micro_batch(*model, buf, batch, scale);
      EXPECT_EQ(model1->last_loss_sum(), model->last_loss_sum());
      for (const auto* p : layout1.all_params())
        EXPECT_EQ(buf1.grad(layout1, p->name), buf.grad(*other, p->name)) << p->name;
    }
  }
  // Each row as its own micro-batch, gradients accumulating in place.
  UnitBuffers split(layout1, ref.file);
  auto row_model = make_model(ref, layout1, 1);
  for (int b = 0; b < ref.B; ++b) {
    const MicroBatch row{ref.tokens.data() + b * ref.T, ref.targets.data() + b * ref.T, 1, ref.T};
    train_micro_batch(*row_model, split, row, scale);
  }
  for (const auto* p : layout1.all_params())
    EXPECT_LT(relative_to_max_error(split.grad(layout1, p->name), buf1.grad(layout1, p->name)), 1e-5)
        << p->name;
}

TEST_P(LlamaFixture, Bf16StaysCloseToFp32AndCheckpointingIsBitwise) {
  const Reference ref = load_reference(GetParam());
  const float scale = 1.0f / static_cast<float>(ref.count);
  const MicroBatch batch{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
  const auto layout = ParamLayout::build(ref.config, 1);
  auto plain = make_model(ref, layout, ref.B, {DType::bf16, false});
  auto checkpointed = make_model(ref, layout, ref.B, {DType::bf16, true});
  UnitBuffers a(layout, ref.file), b(layout, ref.file);
  train_micro_batch(*plain, a, batch, scale);
  train_micro_batch(*checkpointed, b, batch, scale);
  EXPECT_EQ(plain->last_loss_sum(), checkpointed->last_loss_sum());
  const double want_loss = ref.file.at("loss").to_f32()[0];
  EXPECT_NEAR(plain->last_loss_sum() / static_cast<double>(ref.count), want_loss, 2e-2 * want_loss);
  for (const auto* p : layout.all_params()) {
    EXPECT_EQ(a.grad(layout, p->name), b.grad(layout, p->name)) << p->name;
    // bf16 rounds every GEMM input (8 significant bits); the gradients stay within a
    // few per cent of their scale.
    EXPECT_LT(relative_to_max_error(a.grad(layout, p->name), ref.file.at(p->name + ".grad").to_f32()),
              0.1)
        << p->name;
  }
}

TEST_P(LlamaFixture, ThreeAdamWStepsWithClippingMatchPyTorch) {
  const Reference ref = load_reference(GetParam());
  const auto hp = nlohmann::json::parse(ref.file.metadata.at("adamw"));
  const ParamLayout layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  SingleProcessCommunicator comm;
  FlatUnitStrategy strategy(layout, model->unit_needs(), comm, StrategyOptions{});
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const auto values = padded(*info, ref.file.at(p->name).to_f32());
    std::copy(values.begin(), values.end(), strategy.owned(unit).master + info->offset);
  }
  strategy.after_load();
  ModelRunner runner(*model, strategy);
  AdamWOptimizer optimizer(layout, strategy,
                           {hp.at("beta1").get<float>(), hp.at("beta2").get<float>(),
                            hp.at("eps").get<float>(), hp.at("weight_decay").get<float>()});
  const float lr = hp.at("lr").get<float>(), clip = hp.at("grad_clip").get<float>();
  const auto ref_norms = ref.file.at("adamw.grad_norms").to_f32();
  const auto ref_losses = ref.file.at("adamw.losses").to_f32();
  const MicroBatch batch{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
  for (int step = 0; step < 3; ++step) {
    strategy.begin_step(1);
    const double loss = runner.forward(batch, true, 1.0f / static_cast<float>(ref.count)) /
                        static_cast<double>(ref.count);
    runner.backward(batch, 0);
    strategy.finish_gradients();
    const double norm = std::sqrt(strategy.global_grad_norm_squared());
    EXPECT_NEAR(loss, ref_losses[step], 1e-5 * std::fabs(ref_losses[0]));
    EXPECT_NEAR(norm, ref_norms[step], 1e-5 * ref_norms[step]);
    ASSERT_GT(norm, clip) << "the fixture must exercise clipping";
    optimizer.step(lr, clip_multiplier(norm, clip), step + 1);
    strategy.after_step();
  }
  expect_weights_after_three_steps(layout, strategy, ref.file, lr, hp.at("weight_decay").get<float>(), 95);
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaFixture, ::testing::Values("llama", "qwen2", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
