// LoRA against PyPI PEFT on transformers' models in float64 (tools/make_lora_fixture.py):
// loss, logits and every adapter gradient within 1e-5 of the tensor's scale, three AdamW
// steps on the adapters through the real strategy and optimizer; the frozen base gets no
// gradient; B = 0 gives exactly the base model; and the memory a strategy holds is the
// adapters' alone for gradients and optimizer state, to the byte.
#include <gtest/gtest.h>

#include <cmath>

#include "llama_fixture_support.hpp"
#include "relative_error.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

class Lora : public ::testing::TestWithParam<std::string> {};

TEST_P(Lora, LossLogitsAndAdapterGradientsMatchPeft) {
  const Reference ref = load_reference("lora_" + GetParam());
  ASSERT_TRUE(ref.config.lora.enabled());
  const auto layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  UnitBuffers buf(layout, ref.file);
  const MicroBatch batch{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
  train_micro_batch(*model, buf, batch, 1.0f / static_cast<float>(ref.count));
  const double want_loss = ref.file.at("loss").to_f32()[0];
  EXPECT_NEAR(model->last_loss_sum() / static_cast<double>(ref.count), want_loss, 1e-5 * want_loss);
  int adapters = 0;
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    if (is_adapter(p->name)) {
      ++adapters;
      ASSERT_TRUE(layout.units[unit].trainable) << p->name;
      EXPECT_LT(relative_to_max_error(buf.grad(layout, p->name),
                                      ref.file.at(p->name + ".grad").to_f32()),
                1e-5)
          << p->name;
    } else {
      ASSERT_FALSE(layout.units[unit].trainable) << p->name << " belongs to the frozen base";
    }
  }
  EXPECT_EQ(adapters, static_cast<int>(ref.config.lora.targets.size()) * 2 * ref.config.n_layer);
  // The frozen units' gradient buffers were never handed out, so never written.
  for (int u = 0; u < layout.num_units(); ++u) {
    if (layout.units[u].trainable) continue;
    for (float g : buf.grads[u]) ASSERT_EQ(g, 0.0f) << layout.units[u].name;
  }

  const MicroBatch sample{ref.tokens.data(), nullptr, ref.B, ref.T};
  for (int u = 0; u < model->num_units(); ++u) model->forward_unit(u, buf.param_ptrs, {}, sample, false, 1.0f);
  const auto want = ref.file.at("logits").to_f32();
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

TEST_P(Lora, ZeroBGivesExactlyTheBaseModel) {
  const Reference ref = load_reference("lora_" + GetParam());
  ModelConfig base_config = ref.config;
  base_config.lora = LoraConfig{};
  const auto layout = ParamLayout::build(ref.config, 1);
  const auto base_layout = ParamLayout::build(base_config, 1);
  UnitBuffers buf(layout, ref.file), base(base_layout, ref.file);
  for (const auto* p : layout.all_params())
    if (p->name.find(".lora_B.") != std::string::npos) {
      const auto [unit, info] = layout.find(p->name);
      std::fill_n(buf.params[unit].begin() + info->offset, info->numel, 0.0f);
    }
  for (const DType precision : {DType::fp32, DType::bf16}) {
    auto lora = make_model(ref, layout, ref.B, {precision, false});
    auto plain = model_family(base_config.family)
                     .make_model(base_config, base_layout, ref.B, ref.T, {precision, false},
                                 MemoryTracker::global());
    const MicroBatch batch{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
    for (int u = 0; u < lora->num_units(); ++u) lora->forward_unit(u, buf.param_ptrs, {}, batch, false, 1.0f);
    for (int u = 0; u < plain->num_units(); ++u) plain->forward_unit(u, base.param_ptrs, {}, batch, false, 1.0f);
    EXPECT_EQ(lora->last_loss_sum(), plain->last_loss_sum()) << dtype_name(precision);
  }
}

TEST_P(Lora, ThreeAdamWStepsOnTheAdaptersMatchPeft) {
  const Reference ref = load_reference("lora_" + GetParam());
  const auto hp = nlohmann::json::parse(ref.file.metadata.at("adamw"));
  const ParamLayout layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  MemoryTracker tracker;
  SingleProcessCommunicator comm;
  FlatUnitStrategy strategy(layout, model->unit_needs(), comm, StrategyOptions{}, tracker);
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const auto values = padded(*info, ref.file.at(p->name).to_f32());
    std::copy(values.begin(), values.end(), strategy.owned(unit).master + info->offset);
  }
  strategy.after_load();
  // Gradients and AdamW state exist for the adapters only; the base is "frozen".
  int64_t adapter_elements = 0, base_elements = 0;
  for (const auto& unit : layout.units) (unit.trainable ? adapter_elements : base_elements) += unit.padded_numel;
  EXPECT_EQ(tracker.peak(MemCategory::grads), static_cast<size_t>(4 * adapter_elements));
  EXPECT_EQ(tracker.peak(MemCategory::optimizer), static_cast<size_t>(8 * adapter_elements));
  EXPECT_EQ(tracker.peak(MemCategory::frozen), static_cast<size_t>(4 * base_elements));
  EXPECT_EQ(tracker.peak(MemCategory::params), static_cast<size_t>(4 * adapter_elements));

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
    optimizer.step(lr, clip_multiplier(norm, clip), step + 1);
    strategy.after_step();
  }
  // As in test_llama_fixture: AdamW steps are lr-sized whatever the gradient, so the
  // weights agree within 0.2% of 3 lr where the float64 gradient is not tiny.
  const float tight = 2e-3f * 3.0f * lr;
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const float* got = strategy.owned(unit).master + info->offset;
    const auto start = padded(*info, ref.file.at(p->name).to_f32());
    if (!is_adapter(p->name)) {  // the frozen base did not move at all
      for (size_t i = 0; i < start.size(); ++i) ASSERT_EQ(got[i], start[i]) << p->name;
      continue;
    }
    const auto want = ref.file.at(p->name + ".after_3_steps").to_f32();
    const auto grad = ref.file.at(p->name + ".grad").to_f32();
    float max_grad = 0.0f;
    for (float g : grad) max_grad = std::max(max_grad, std::fabs(g));
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::fabs(grad[i]) < 1e-3f * max_grad) continue;
      ASSERT_NEAR(got[i], want[i], tight) << p->name << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Lora, ::testing::Values("llama", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
