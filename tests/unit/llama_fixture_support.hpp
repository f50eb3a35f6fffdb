// Shared by the tests that hold the Llama-family model to transformers/PEFT fixtures
// (test_llama_fixture.cpp, test_lora.cpp): the fixture, flat unit buffers filled from
// it by name, and one training micro-batch through every unit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/parallel/owned_state.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm::testing {

namespace st = shardlm::safetensors;

struct Reference {
  st::File file;
  ModelConfig config;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  int64_t count = 0;
};

// tests/fixtures/NAME_fixture.safetensors (tools/make_llama_fixture.py, make_lora_fixture.py).
inline Reference load_reference(const std::string& name) {
  Reference r;
  r.file = st::read_file(std::string(SHARDLM_FIXTURE_DIR) + "/" + name + "_fixture.safetensors");
  r.config = ModelConfig::from_json(nlohmann::json::parse(r.file.metadata.at("config")));
  const auto batch = nlohmann::json::parse(r.file.metadata.at("batch"));
  r.B = batch.at("B").get<int>();
  r.T = batch.at("T").get<int>();
  for (auto v : r.file.at("tokens").to_i64()) r.tokens.push_back(static_cast<int32_t>(v));
  for (auto v : r.file.at("targets").to_i64()) r.targets.push_back(static_cast<int32_t>(v));
  r.count = std::count_if(r.targets.begin(), r.targets.end(), [](int32_t t) { return t >= 0; });
  return r;
}

// The fixture's tensor `name` laid out as shardlm holds it: vocabulary matrices get
// their zero padding rows.
inline std::vector<float> padded(const ParamInfo& p, std::vector<float> values) {
  values.resize(static_cast<size_t>(p.numel), 0.0f);
  return values;
}

// Flat unit buffers for parameters and gradients; the model takes one pointer per
// model unit, where the layout placed it.
struct UnitBuffers {
  std::vector<std::vector<float>> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;

  UnitBuffers(const ParamLayout& layout, const st::File& file) {
    for (const auto& unit : layout.units) {
      params.emplace_back(unit.padded_numel, 0.0f);
      grads.emplace_back(unit.padded_numel, 0.0f);
    }
    // Frozen units (LoRA's base) get no gradient buffer, as a strategy hands them.
    for (const auto& place : layout.model_units) {
      param_ptrs.push_back(params[place.unit].data() + place.base);
      grad_ptrs.push_back(layout.units[place.unit].trainable ? grads[place.unit].data() + place.base
                                                             : nullptr);
    }
    for (const auto* p : layout.all_params()) {
      const auto [unit, info] = layout.find(p->name);
      const auto values = padded(*info, file.at(p->name).to_f32());
      std::copy(values.begin(), values.end(), params[unit].begin() + info->offset);
    }
  }
  std::vector<float> grad(const ParamLayout& layout, const std::string& name) const {
    const auto [unit, info] = layout.find(name);
    const int64_t real = info->valid_rows < 0 ? info->numel : info->valid_rows * info->shape[1];
    return std::vector<float>(grads[unit].begin() + info->offset,
                              grads[unit].begin() + info->offset + real);
  }
};

inline std::unique_ptr<Model> make_model(const Reference& ref, const ParamLayout& layout, int B,
                                  ModelOptions options = {}) {
  return model_family(ref.config.family)
      .make_model(ref.config, layout, B, ref.T, options, MemoryTracker::global());
}

inline void train_micro_batch(Model& model, UnitBuffers& buf, const MicroBatch& batch, float grad_scale) {
  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, buf.param_ptrs, buf.grad_ptrs, batch, true, grad_scale);
  for (int u = model.num_units() - 1; u >= 0; --u)
    model.backward_unit(u, buf.param_ptrs, buf.grad_ptrs, batch);
}

// The inference logits of the fixture's tokens, [B, T, V] as the fixtures store them.
inline std::vector<float> fixture_logits(Model& model, const UnitBuffers& buf, const Reference& ref) {
  const MicroBatch sample{ref.tokens.data(), nullptr, ref.B, ref.T};
  for (int u = 0; u < model.num_units(); ++u) model.forward_unit(u, buf.param_ptrs, {}, sample, false, 1.0f);
  const size_t V = static_cast<size_t>(ref.config.vocab_size);
  std::vector<float> got(static_cast<size_t>(ref.B) * ref.T * V), at_t(static_cast<size_t>(ref.B) * V);
  for (int t = 0; t < ref.T; ++t) {
    model.logits_at(buf.param_ptrs, t, at_t.data());
    for (int b = 0; b < ref.B; ++b)
      std::copy_n(at_t.begin() + static_cast<long>(b * V), V,
                  got.begin() + static_cast<long>((static_cast<size_t>(b) * ref.T + t) * V));
  }
  return got;
}

// A mixture-of-experts fixture's one micro-batch: its aux loss enters whole.
inline MicroBatch moe_fixture_batch(const Reference& ref) {
  MicroBatch batch{ref.tokens.data(), ref.targets.data(), ref.B, ref.T};
  batch.aux_loss_share = 1.0f;
  return batch;
}

// The fixture's weights into the strategy's owned state.
inline void load_fixture_weights(const ParamLayout& layout, FlatUnitStrategy& strategy, const st::File& file) {
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const auto values = padded(*info, file.at(p->name).to_f32());
    std::copy(values.begin(), values.end(), strategy.owned(unit).master + info->offset);
  }
  strategy.after_load();
}

// A mixture-of-experts fixture's three AdamW steps with clipping through the strategy
// and optimizer: each step's loss (with the aux loss) and gradient norm within 1e-5.
inline void run_moe_three_adamw_steps(const Reference& ref, Model& model, FlatUnitStrategy& strategy,
                                      const ParamLayout& layout) {
  const auto hp = nlohmann::json::parse(ref.file.metadata.at("adamw"));
  ModelRunner runner(model, strategy);
  AdamWOptimizer optimizer(layout, strategy,
                           {hp.at("beta1").get<float>(), hp.at("beta2").get<float>(),
                            hp.at("eps").get<float>(), hp.at("weight_decay").get<float>()});
  const float lr = hp.at("lr").get<float>(), clip = hp.at("grad_clip").get<float>();
  const auto ref_norms = ref.file.at("adamw.grad_norms").to_f32();
  const auto ref_losses = ref.file.at("adamw.losses").to_f32();
  const MicroBatch batch = moe_fixture_batch(ref);
  for (int step = 0; step < 3; ++step) {
    strategy.begin_step(1);
    const double ce = runner.forward(batch, true, 1.0f / static_cast<float>(ref.count)) /
                      static_cast<double>(ref.count);
    const double loss = ce + ref.config.moe.aux_loss_coef() * model.last_aux_loss();
    runner.backward(batch, 0);
    strategy.finish_gradients();
    const double norm = std::sqrt(strategy.global_grad_norm_squared());
    EXPECT_NEAR(loss, ref_losses[step], 1e-5 * std::fabs(ref_losses[0]));
    EXPECT_NEAR(norm, ref_norms[step], 1e-5 * ref_norms[step]);
    ASSERT_GT(norm, clip) << "the fixture must exercise clipping";
    optimizer.step(lr, clip_multiplier(norm, clip), step + 1);
    strategy.after_step();
  }
}

// The weights after the fixture's three AdamW steps against the float64 reference.
// AdamW moves every weight by about lr per step whatever the size of its gradient
// (m / sqrt(v) is scale-free). Where the float64 gradient is large enough that
// float32's error (~1e-6 of the tensor's largest gradient) is a small part of it, the
// three steps agree within 0.2% of 3 lr. Where it is tiny (< 1e-3 of the largest; e.g.
// k biases along RoPE's slowest frequencies, nearly invariant like GPT-2's key bias)
// the rounding noise takes a full step of its own: those elements are only held to the
// step bound 3 lr (1 + weight decay). At least min_tight_percent of them are checked tightly.
// A fixture that stores NAME.adamw_least_moment_fraction (tools/make_moe_fixture.py: the
// element's smallest |m| / max |m of the tensor| over the three steps, m AdamW's first
// moment, whose first value is (1 - beta1) grad) is classified by m at every step, not
// by the first gradient alone: where a later gradient turns against the earlier ones m
// cancels, and the step is as noise-bound as one whose gradient starts tiny. m after
// step 3 carries three gradients' float32 noise (~6e-7 of the largest each, summed with
// cancellation), so its threshold is 2e-3 of the tensor's largest m (first step:
// 1e-3 of its largest gradient, as above); below it the step bound holds.
// `checked` picks the parameters held to the reference (null: every one).
inline void expect_weights_after_three_steps(const ParamLayout& layout, OwnedState& state,
                                             const st::File& ref, float lr, float weight_decay,
                                             int64_t min_tight_percent,
                                             const std::function<bool(const std::string&)>& checked = nullptr) {
  const float tight = 2e-3f * 3.0f * lr;
  const float step_bound = 3.0f * lr * (1.0f + weight_decay);
  int64_t checked_tightly = 0, total = 0;
  for (const auto* p : layout.all_params()) {
    if (checked && !checked(p->name)) continue;
    const auto [unit, info] = layout.find(p->name);
    const auto want = ref.at(p->name + ".after_3_steps").to_f32();
    const auto grad = ref.at(p->name + ".grad").to_f32();
    const auto before = ref.at(p->name).to_f32();
    float max_grad = 0.0f;
    for (float g : grad) max_grad = std::max(max_grad, std::fabs(g));
    const float* got = state.owned(unit).master + info->offset;
    const std::string least_name = p->name + ".adamw_least_moment_fraction";
    const std::vector<float> least =
        ref.tensors.count(least_name) ? ref.at(least_name).to_f32() : std::vector<float>{};
    for (size_t i = 0; i < want.size(); ++i) {
      ++total;
      const bool well_conditioned = least.empty() ? std::fabs(grad[i]) >= 1e-3f * max_grad : least[i] >= 2e-3f;
      if (well_conditioned) {
        ++checked_tightly;
        ASSERT_NEAR(got[i], want[i], tight) << p->name << "[" << i << "]";
      } else {
        ASSERT_NEAR(got[i], before[i], step_bound * (1.0f + std::fabs(before[i])))
            << p->name << "[" << i << "]";
      }
    }
  }
  EXPECT_GT(checked_tightly, total * min_tight_percent / 100) << "nearly every weight is checked tightly";
}

}  // namespace shardlm::testing
