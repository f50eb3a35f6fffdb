// The GPT-2 model against an independent PyTorch reference
// (tools/make_gpt2_fixture.py: float64 autograd, stored as float32): loss,
// every parameter gradient and last-position logits; then the same numbers must not
// change with the world size's padding, with model units merged into one flat unit,
// or when the batch is split into micro-batches that accumulate into the same
// gradient buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"
#include "relative_error.hpp"

namespace st = shardlm::safetensors;

namespace {

struct Reference {
  st::File file;
  shardlm::ModelConfig config;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
};

const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    r.file = st::read_file(std::string(SHARDLM_FIXTURE_DIR) + "/gpt2_fixture.safetensors");
    r.config = shardlm::ModelConfig::from_json(nlohmann::json::parse(r.file.metadata.at("config")));
    const auto batch = nlohmann::json::parse(r.file.metadata.at("batch"));
    r.B = batch.at("B").get<int>();
    r.T = batch.at("T").get<int>();
    for (auto v : r.file.at("tokens").to_i64()) r.tokens.push_back(static_cast<int32_t>(v));
    for (auto v : r.file.at("targets").to_i64()) r.targets.push_back(static_cast<int32_t>(v));
    return r;
  }();
  return ref;
}

// Flat unit buffers for parameters and gradients, filled from the fixture by name.
// The model takes one pointer per MODEL unit: where the layout placed it.
struct UnitBuffers {
  std::vector<std::vector<float>> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;

  explicit UnitBuffers(const shardlm::ParamLayout& layout) {
    for (const auto& unit : layout.units) {
      params.emplace_back(unit.padded_numel, 0.0f);
      grads.emplace_back(unit.padded_numel, 0.0f);
    }
    for (const auto& place : layout.model_units) {
      param_ptrs.push_back(params[place.unit].data() + place.base);
      grad_ptrs.push_back(grads[place.unit].data() + place.base);
    }
    for (const auto* p : layout.all_params()) {
      const auto [unit, info] = layout.find(p->name);
      const std::vector<float> values = reference().file.at(p->name).to_f32();
      EXPECT_EQ(static_cast<int64_t>(values.size()), info->numel) << p->name;
      std::copy(values.begin(), values.end(), params[unit].begin() + info->offset);
    }
  }
  // The gradient of one parameter, copied out of its unit buffer.
  std::vector<float> grad(const shardlm::ParamLayout& layout, const std::string& name) const {
    const auto [unit, info] = layout.find(name);
    return std::vector<float>(grads[unit].begin() + info->offset,
                              grads[unit].begin() + info->offset + info->numel);
  }
};

// One training micro-batch: forward of every unit, then backward in reverse.
void train_micro_batch(shardlm::Gpt2Model& model, UnitBuffers& buf, const int32_t* tokens,
                       const int32_t* targets, int B, int T, float grad_scale) {
  const shardlm::MicroBatch batch{tokens, targets, B, T};
  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, buf.param_ptrs, buf.grad_ptrs, batch, true, grad_scale);
  for (int u = model.num_units() - 1; u >= 0; --u)
    model.backward_unit(u, buf.param_ptrs, buf.grad_ptrs, batch);
}

int64_t count_targets() {
  return std::count_if(reference().targets.begin(), reference().targets.end(),
                       [](int32_t t) { return t != shardlm::kIgnoreIndex; });
}

TEST(Gpt2Fixture, LossGradientsAndLogitsMatchPyTorch) {
  const Reference& ref = reference();
  const auto layout = shardlm::ParamLayout::build(ref.config, 1);
  shardlm::Gpt2Model model(ref.config, layout, ref.B, ref.T);
  UnitBuffers buf(layout);
  const int64_t count = count_targets();
  ASSERT_GT(count, 0);
  ASSERT_LT(count, ref.B * ref.T);  // the fixture ignores some targets
  train_micro_batch(model, buf, ref.tokens.data(), ref.targets.data(), ref.B, ref.T,
                    1.0f / static_cast<float>(count));

  EXPECT_EQ(model.last_target_count(), count);
  const double loss = model.last_loss_sum() / static_cast<double>(count);
  const double want_loss = ref.file.at("loss").to_f32()[0];
  EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);

  for (const auto* p : layout.all_params()) {
    const std::vector<float> want = ref.file.at(p->name + ".grad").to_f32();
    EXPECT_LT(relative_to_max_error(buf.grad(layout, p->name), want), 1e-4) << p->name;
  }
  // Padding (alignment gaps, unit tails, padded vocabulary rows) gets no gradient.
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<bool> is_param(layout.units[u].padded_numel, false);
    for (const auto& p : layout.units[u].params) {
      const int64_t real = p.valid_rows < 0 ? p.numel : p.valid_rows * p.shape[1];
      std::fill(is_param.begin() + p.offset, is_param.begin() + p.offset + real, true);
    }
    for (int64_t i = 0; i < layout.units[u].padded_numel; ++i)
      if (!is_param[i]) {
        ASSERT_EQ(buf.grads[u][i], 0.0f) << "unit " << u << " element " << i;
      }
  }

  // Evaluation forward with targets gives the same loss; with no targets, logits.
  const shardlm::MicroBatch eval{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
  for (int u = 0; u < model.num_units(); ++u) model.forward_unit(u, buf.param_ptrs, {}, eval, false, 1.0f);
  EXPECT_NEAR(model.last_loss_sum() / static_cast<double>(count), want_loss, 1e-5 * want_loss);
  const shardlm::MicroBatch sample{ref.tokens.data(), nullptr, ref.B, ref.T};
  for (int u = 0; u < model.num_units(); ++u) model.forward_unit(u, buf.param_ptrs, {}, sample, false, 1.0f);
  std::vector<float> logits(static_cast<size_t>(ref.B) * ref.config.vocab_size);
  model.logits_at(buf.param_ptrs, ref.T - 1, logits.data());
  EXPECT_LT(relative_to_max_error(logits, ref.file.at("logits_last").to_f32()), 1e-4);
}

TEST(Gpt2Fixture, WorldSizePaddingAndMergedUnitsDoNotChangeAnything) {
  const Reference& ref = reference();
  const float scale = 1.0f / static_cast<float>(count_targets());
  const auto layout1 = shardlm::ParamLayout::build(ref.config, 1);
  const auto layout3 = shardlm::ParamLayout::build(ref.config, 3);
  bool padding_differs = false;
  for (int u = 0; u < layout1.num_units(); ++u)
    padding_differs |= layout1.units[u].padded_numel != layout3.units[u].padded_numel;
  ASSERT_TRUE(padding_differs) << "world size 3 should pad some unit differently";
  // Blocks here hold ~3.3k values: 3000 merges the embeddings with block 0 and the
  // final norm with block 1, so the tied head reads wte from a merged unit.
  const auto merged = shardlm::ParamLayout::build(ref.config, 3, 3000);
  ASSERT_EQ(merged.num_units(), 2);
  ASSERT_EQ(merged.num_model_units(), layout1.num_model_units());

  shardlm::Gpt2Model model1(ref.config, layout1, ref.B, ref.T);
  UnitBuffers buf1(layout1);
  train_micro_batch(model1, buf1, ref.tokens.data(), ref.targets.data(), ref.B, ref.T, scale);
  for (const shardlm::ParamLayout* other : {&layout3, &merged}) {
    shardlm::Gpt2Model model(ref.config, *other, ref.B, ref.T);
    UnitBuffers buf(*other);
    train_micro_batch(model, buf, ref.tokens.data(), ref.targets.data(), ref.B, ref.T, scale);
    EXPECT_EQ(model1.last_loss_sum(), model.last_loss_sum());
    for (const auto* p : layout1.all_params())
      EXPECT_EQ(buf1.grad(layout1, p->name), buf.grad(*other, p->name)) << p->name;
  }
}

TEST(Gpt2Fixture, MicroBatchesAccumulateToTheFullBatchGradient) {
  const Reference& ref = reference();
  const auto layout = shardlm::ParamLayout::build(ref.config, 1);
  const float scale = 1.0f / static_cast<float>(count_targets());

  shardlm::Gpt2Model model(ref.config, layout, ref.B, ref.T);
  UnitBuffers full(layout);
  train_micro_batch(model, full, ref.tokens.data(), ref.targets.data(), ref.B, ref.T, scale);
  const double full_loss_sum = model.last_loss_sum();

  // Each row of the batch as its own micro-batch, gradients accumulating in place.
  UnitBuffers split(layout);
  double split_loss_sum = 0.0;
  for (int b = 0; b < ref.B; ++b) {
    train_micro_batch(model, split, ref.tokens.data() + b * ref.T, ref.targets.data() + b * ref.T,
                      1, ref.T, scale);
    split_loss_sum += model.last_loss_sum();
  }
  EXPECT_NEAR(split_loss_sum, full_loss_sum, 1e-6 * full_loss_sum);
  for (const auto* p : layout.all_params()) {
    const auto want = full.grad(layout, p->name);
    EXPECT_LT(relative_to_max_error(split.grad(layout, p->name), want), 1e-5) << p->name;
    EXPECT_LT(relative_to_max_error(split.grad(layout, p->name),
                                    ref.file.at(p->name + ".grad").to_f32()),
              1e-4)
        << p->name;
  }
}

}  // namespace
