// Three full training steps (forward, backward, global-norm clipping, AdamW with
// decoupled decay on 2-D weights) through the real strategy and optimizer code,
// against PyTorch's torch.optim.AdamW + clip_grad_norm_ on the same model and batch
// (tools/make_gpt2_fixture.py). Tolerance: 1e-4 of each tensor's max magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"
#include "shardlm/optim/adamw.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

using namespace shardlm;

TEST(TrainStepFixture, ThreeAdamWStepsWithClippingMatchPyTorch) {
  const auto file =
      safetensors::read_file(std::string(SHARDLM_FIXTURE_DIR) + "/gpt2_fixture.safetensors");
  const ModelConfig config = ModelConfig::from_json(nlohmann::json::parse(file.metadata.at("config")));
  const auto batch_meta = nlohmann::json::parse(file.metadata.at("batch"));
  const auto hp = nlohmann::json::parse(file.metadata.at("adamw"));
  const int B = batch_meta.at("B").get<int>(), T = batch_meta.at("T").get<int>();
  std::vector<int32_t> tokens, targets;
  for (auto v : file.at("tokens").to_i64()) tokens.push_back(static_cast<int32_t>(v));
  for (auto v : file.at("targets").to_i64()) targets.push_back(static_cast<int32_t>(v));
  int64_t count = std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });

  const ParamLayout layout = ParamLayout::build(config, 1);
  Gpt2Model model(config, layout, B, T);
  std::vector<std::vector<int>> needs;
  for (int m = 0; m < model.num_units(); ++m) needs.push_back(model.units_needed_for(m));
  SingleProcessCommunicator comm;
  FlatUnitStrategy strategy(layout, needs, comm, StrategyOptions{});
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const auto values = file.at(p->name).to_f32();
    std::copy(values.begin(), values.end(), strategy.owned(unit).master + info->offset);
  }
  strategy.after_load();
  ModelRunner runner(model, strategy);

  const AdamWConfig adam{hp.at("beta1").get<float>(), hp.at("beta2").get<float>(),
                         hp.at("eps").get<float>(), hp.at("weight_decay").get<float>()};
  const float lr = hp.at("lr").get<float>();
  const float clip = hp.at("grad_clip").get<float>();
  const auto ref_norms = file.at("adamw.grad_norms").to_f32();
  const auto ref_losses = file.at("adamw.losses").to_f32();
  const MicroBatch batch{tokens.data(), targets.data(), B, T};
  for (int step = 0; step < 3; ++step) {
    strategy.begin_step(1);
    const double loss = runner.forward(batch, true, 1.0f / static_cast<float>(count)) /
                        static_cast<double>(count);
    runner.backward(batch, 0);
    strategy.finish_gradients();
    const double norm = std::sqrt(strategy.global_grad_norm_squared());
    EXPECT_NEAR(loss, ref_losses[static_cast<size_t>(step)], 1e-5 * std::fabs(ref_losses[0]));
    EXPECT_NEAR(norm, ref_norms[static_cast<size_t>(step)], 1e-4 * ref_norms[static_cast<size_t>(step)]);
    ASSERT_GT(norm, clip) << "the fixture must exercise clipping";
    const float multiplier = clip_multiplier(norm, clip);
    for (int u = 0; u < layout.num_units(); ++u) {
      OwnedSlice s = strategy.owned(u);
      auto decay = weight_decay_ranges(layout.units[static_cast<size_t>(u)], s.begin, s.end);
      adamw_update(s.master, s.grad, s.adam_m, s.adam_v, s.size(), decay, lr, multiplier, step + 1,
                   adam, s.compute_copy);
    }
    strategy.after_step();
  }
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const auto want = file.at(p->name + ".after_3_steps").to_f32();
    const float* got = strategy.owned(unit).master + info->offset;
    float max_mag = 0.0f;
    for (float w : want) max_mag = std::max(max_mag, std::fabs(w));
    // The key bias (c_attn.bias[C, 2C)) has an exactly zero gradient: softmax is
    // invariant to adding q.b to every score of a row. Both implementations feed
    // rounding noise (1e-17 in PyTorch's float64, 1e-9 here) to Adam, which scales
    // any nonzero gradient to an lr-sized step of arbitrary sign, so those elements
    // are compared through their reference gradient being zero instead.
    const bool has_key_bias = p->name.find("attn.c_attn.bias") != std::string::npos;
    const size_t C = static_cast<size_t>(config.n_embd);
    if (has_key_bias) {
      const auto grad = file.at(p->name + ".grad").to_f32();
      float max_grad = 0.0f;
      for (float g : grad) max_grad = std::max(max_grad, std::fabs(g));
      for (size_t i = C; i < 2 * C; ++i) ASSERT_LT(std::fabs(grad[i]), 1e-6f * max_grad) << i;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (has_key_bias && i >= C && i < 2 * C) continue;
      ASSERT_NEAR(got[i], want[i], 1e-4f * max_mag) << p->name << "[" << i << "]";
    }
  }
}
