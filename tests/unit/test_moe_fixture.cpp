// The mixture-of-experts families (qwen3_moe, qwen2_moe, mixtral) against transformers'
// own Qwen3MoeForCausalLM / Qwen2MoeForCausalLM / MixtralForCausalLM in float64
// (tools/make_moe_fixture.py; qwen2_moe with its gated shared expert, q/k/v biases,
// un-renormalised top-3 weights and decoder_sparse_step 2):
// loss with the load-balancing loss, logits at every position, every gradient (the
// routers' included) within 1e-5 of each tensor's scale, three AdamW steps with
// clipping through the real strategy and optimizer; Hugging Face directories written by
// save_pretrained import with transformers' logits and export back bitwise; bad
// configurations are one-line errors naming the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hf_loaded_model.hpp"
#include "llama_fixture_support.hpp"
#include "relative_error.hpp"
#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_export.hpp"
#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/moe/moe_routing.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/train/model_runner.hpp"

namespace fs = std::filesystem;
using namespace shardlm;
using shardlm::testing_support::HfLoadedModel;
using namespace shardlm::testing;

namespace {

const fs::path kHfDir = fs::path(SHARDLM_FIXTURE_DIR) / "hf";

class MoeFixture : public ::testing::TestWithParam<std::string> {};


TEST_P(MoeFixture, LossLogitsAndEveryGradientMatchTransformers) {
  const Reference ref = load_reference(GetParam());
  ASSERT_TRUE(ref.config.moe.enabled());
  ASSERT_GT(ref.config.moe.aux_loss_coef(), 0.0);
  const auto layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  UnitBuffers buf(layout, ref.file);
  train_micro_batch(*model, buf, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));

  const double ce = model->last_loss_sum() / static_cast<double>(ref.count);
  const double aux = model->last_aux_loss();
  EXPECT_NEAR(ce, ref.file.at("ce_loss").to_f32()[0], 1e-5 * ce);
  EXPECT_NEAR(aux, ref.file.at("aux_loss").to_f32()[0], 1e-5 * aux);
  const double loss = ce + ref.config.moe.aux_loss_coef() * aux;
  EXPECT_NEAR(loss, ref.file.at("loss").to_f32()[0], 1e-5 * loss);
  int routers = 0;
  for (const auto* p : layout.all_params()) {
    routers += p->name.find(".gate.weight") != std::string::npos;
    EXPECT_LT(relative_to_max_error(buf.grad(layout, p->name), ref.file.at(p->name + ".grad").to_f32()),
              1e-5)
        << p->name;
  }
  EXPECT_EQ(routers, ref.config.moe.sparse_layers(ref.config.n_layer));

  EXPECT_LT(relative_to_max_error(fixture_logits(*model, buf, ref), ref.file.at("logits").to_f32()), 1e-5);
}

TEST_P(MoeFixture, TheAuxLossGradientIsTheCoefficientTimesItsShare) {
  // Without the aux loss's share the router gradients differ from the fixture's (the
  // aux term matters), and the experts' do not move (it reaches only the routers).
  const Reference ref = load_reference(GetParam());
  const auto layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  UnitBuffers buf(layout, ref.file);
  MicroBatch batch = moe_fixture_batch(ref);
  batch.aux_loss_share = 0.0f;
  train_micro_batch(*model, buf, batch, 1.0f / static_cast<float>(ref.count));
  for (const auto* p : layout.all_params()) {
    const double error =
        relative_to_max_error(buf.grad(layout, p->name), ref.file.at(p->name + ".grad").to_f32());
    if (p->name.find(".gate.weight") != std::string::npos) {
      EXPECT_GT(error, 1e-3) << p->name;
    }
  }
}

TEST_P(MoeFixture, MergedUnitsPaddingAndCheckpointingChangeNoBit) {
  const Reference ref = load_reference(GetParam());
  const float scale = 1.0f / static_cast<float>(ref.count);
  const auto layout1 = ParamLayout::build(ref.config, 1);
  auto model1 = make_model(ref, layout1, ref.B);
  UnitBuffers buf1(layout1, ref.file);
  train_micro_batch(*model1, buf1, moe_fixture_batch(ref), scale);
  const auto merged = ParamLayout::build(ref.config, 3, 60000);
  ASSERT_LT(merged.num_units(), layout1.num_units());
  for (const ParamLayout* other : {&layout1, &merged})
    for (const bool checkpointing : {false, true})
      for (const DType precision : {DType::fp32, DType::bf16}) {
        if (other == &layout1 && !checkpointing) continue;
        auto model = make_model(ref, *other, ref.B, {precision, checkpointing});
        UnitBuffers buf(*other, ref.file);
        train_micro_batch(*model, buf, moe_fixture_batch(ref), scale);
        if (precision == DType::bf16) {
          // Activation checkpointing recomputes bitwise what the forward kept.
          auto plain = make_model(ref, layout1, ref.B, {DType::bf16, false});
          UnitBuffers want(layout1, ref.file);
          train_micro_batch(*plain, want, moe_fixture_batch(ref), scale);
          EXPECT_EQ(plain->last_loss_sum(), model->last_loss_sum());
          for (const auto* p : layout1.all_params())
            EXPECT_EQ(want.grad(layout1, p->name), buf.grad(*other, p->name)) << p->name << " bf16";
          continue;
        }
        EXPECT_EQ(model1->last_loss_sum(), model->last_loss_sum());
        EXPECT_EQ(model1->last_aux_loss(), model->last_aux_loss());
        for (const auto* p : layout1.all_params())
          EXPECT_EQ(buf1.grad(layout1, p->name), buf.grad(*other, p->name))
              << p->name << (checkpointing ? " checkpointing" : "");
      }
}

TEST_P(MoeFixture, Bf16StaysCloseToFp32WhereNoChoiceCanFlip) {
  // With every expert chosen (top-k = E) bf16's rounding cannot change which experts a
  // token sees: its gradients stay within a few per cent of fp32's.
  Reference ref = load_reference(GetParam());
  ref.config.moe.top_k = ref.config.moe.num_experts;
  const auto layout = ParamLayout::build(ref.config, 1);
  auto fp32 = make_model(ref, layout, ref.B);
  auto bf16 = make_model(ref, layout, ref.B, {DType::bf16, false});
  UnitBuffers a(layout, ref.file), b(layout, ref.file);
  train_micro_batch(*fp32, a, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
  train_micro_batch(*bf16, b, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
  EXPECT_NEAR(bf16->last_loss_sum(), fp32->last_loss_sum(), 1e-2 * fp32->last_loss_sum());
  EXPECT_NEAR(bf16->last_aux_loss(), fp32->last_aux_loss(), 1e-2 * fp32->last_aux_loss());
  for (const auto* p : layout.all_params())
    EXPECT_LT(relative_to_max_error(b.grad(layout, p->name), a.grad(layout, p->name)), 0.1) << p->name;
}

TEST_P(MoeFixture, Bf16LossStaysCloseToFp32) {
  // With top-2 routing bf16's rounding of the router's inputs flips some tokens' choice
  // of expert (a different sub-network, not an error: up to ~40% on some tensors'
  // gradients here), so only the loss is held to float64's; the gradients are held
  // where no choice can flip (above).
  const Reference ref = load_reference(GetParam());
  const auto layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B, {DType::bf16, false});
  UnitBuffers buf(layout, ref.file);
  train_micro_batch(*model, buf, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
  const double want = ref.file.at("ce_loss").to_f32()[0];
  EXPECT_NEAR(model->last_loss_sum() / static_cast<double>(ref.count), want, 2e-2 * want);
  const double want_aux = ref.file.at("aux_loss").to_f32()[0];
  EXPECT_NEAR(model->last_aux_loss(), want_aux, 5e-2 * want_aux);
}

TEST_P(MoeFixture, ThreeAdamWStepsWithClippingMatchPyTorch) {
  const Reference ref = load_reference(GetParam());
  const auto hp = nlohmann::json::parse(ref.file.metadata.at("adamw"));
  const ParamLayout layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  SingleProcessCommunicator comm;
  FlatUnitStrategy strategy(layout, model->unit_needs(), comm, StrategyOptions{});
  load_fixture_weights(layout, strategy, ref.file);
  run_moe_three_adamw_steps(ref, *model, strategy, layout);
  expect_weights_after_three_steps(layout, strategy, ref.file, hp.at("lr").get<float>(),
                                   hp.at("weight_decay").get<float>(), 90);
}

INSTANTIATE_TEST_SUITE_P(Families, MoeFixture, ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"),
                         [](const auto& info) { return info.param; });

// --- Hugging Face directories (save_pretrained, one tensor per expert) ---------------


class MoeHfInterchange : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    work_ = fs::temp_directory_path() / ("shardlm-moe-hf-" + GetParam() + "-" + std::to_string(::getpid()));
    fs::remove_all(work_);
    fs::create_directories(work_);
  }
  void TearDown() override { fs::remove_all(work_); }
  fs::path work_;
};

std::vector<int32_t> hf_tokens(const st::File& file) {
  std::vector<int32_t> tokens;
  for (auto v : file.at("tokens").to_i64()) tokens.push_back(static_cast<int32_t>(v));
  return tokens;
}

TEST_P(MoeHfInterchange, LoadsWithTransformersLogitsAndExportsBackBitwise) {
  const std::string dir = (kHfDir / GetParam()).string();
  const st::File reference = st::read_file((kHfDir / "moe_logits.safetensors").string());
  HfLoadedModel loaded(dir, 16);
  EXPECT_EQ(loaded.config.family, GetParam());
  EXPECT_LT(relative_to_max_error(loaded.logits(hf_tokens(reference)),
                                  reference.at(GetParam() + ".logits").to_f32()),
            1e-5);
  CheckpointInfo info{0, 0, loaded.config, "byte", "ddp", 1, {{"options", {{"init_from", dir}}}}};
  const std::string ckpt_dir =
      save_checkpoint((work_ / "run").string(), loaded.layout, *loaded.strategy, info, 0, loaded.comm);
  const fs::path out = work_ / "export";
  HfExportOptions options;
  options.out_dir = out.string();
  options.dtype = DType::fp32;
  options.max_shard_bytes = 5'000'000'000;
  export_hugging_face(CheckpointReader(ckpt_dir), options);
  EXPECT_EQ(read_hf_model_config(out.string()), loaded.config);
  // Every tensor save_pretrained wrote comes back under its name, bit for bit.
  const st::File source = st::read_file((fs::path(dir) / "model.safetensors").string());
  const st::File exported = st::read_file((out / "model.safetensors").string());
  ASSERT_EQ(source.tensors.size(), exported.tensors.size());
  for (const auto& [name, tensor] : source.tensors) EXPECT_EQ(exported.at(name).to_f32(), tensor.to_f32()) << name;
  HfLoadedModel again(out.string(), 16);
  for (int u = 0; u < loaded.layout.num_units(); ++u) EXPECT_EQ(loaded.master(u), again.master(u));
}

INSTANTIATE_TEST_SUITE_P(Families, MoeHfInterchange, ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe"),
                         [](const auto& info) { return info.param; });

// --- routing and bad input -------------------------------------------------------------

TEST(MoeRouting, TopKGroupsTokensByExpertAndBreaksTiesTowardTheLowerExpert) {
  // 3 tokens, 4 experts, top-2: token 1 ties experts 1 and 3.
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, -1.0f,  //
                                     0.0f, 1.0f, -5.0f, 1.0f,  //
                                     3.0f, 0.0f, 0.0f, 2.5f};
  std::vector<float> probs(12), weight(6);
  std::vector<int32_t> top(6), begin(5), token(6), slot(6);
  MoeRouting r{probs.data(), top.data(), weight.data(), begin.data(), token.data(), slot.data()};
  route_tokens(logits.data(), {3, 4, 2, true}, r);
  EXPECT_EQ(top, (std::vector<int32_t>{1, 2, 1, 3, 0, 3}));
  EXPECT_EQ(begin, (std::vector<int32_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(token, (std::vector<int32_t>{2, 0, 1, 0, 1, 2}));
  EXPECT_NEAR(weight[0] + weight[1], 1.0f, 1e-6f);
  EXPECT_NEAR(weight[2], 0.5f, 1e-6f);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

nlohmann::json hf_config(const std::string& family) {
  return nlohmann::json::parse(std::ifstream(kHfDir / family / "config.json"));
}

TEST(MoeBadInput, TopKBeyondTheExpertsIsRefusedByName) {
  ModelConfig c = model_preset("qwen3-moe-tiny");
  c.moe.top_k = 9;
  EXPECT_NE(error_of([&] { c.validate(); }).find("num_experts_per_tok (top-k) must be in [1, num_experts = 8], got 9"),
            std::string::npos);
  nlohmann::json j = hf_config("mixtral");
  j["num_experts_per_tok"] = 5;
  const std::string e = error_of([&] { model_family_for_hf("mixtral").config_from_hf(j); });
  EXPECT_NE(e.find("num_experts_per_tok (top-k) must be in [1, num_experts = 4], got 5"), std::string::npos) << e;
}

TEST(MoeBadInput, RouterVariantsShardlmDoesNotComputeAreRefusedByName) {
  nlohmann::json j = hf_config("mixtral");
  j["router_jitter_noise"] = 0.1;
  EXPECT_NE(error_of([&] { model_family_for_hf("mixtral").config_from_hf(j); }).find("router_jitter_noise"),
            std::string::npos);
  j = hf_config("qwen3_moe");
  j["router_z_loss_coef"] = 0.001;
  EXPECT_NE(error_of([&] { model_family_for_hf("qwen3_moe").config_from_hf(j); }).find("router_z_loss_coef"),
            std::string::npos);
  j = hf_config("qwen3_moe");
  j["shared_expert_intermediate_size"] = 64;
  EXPECT_NE(error_of([&] { model_family_for_hf("qwen3_moe").config_from_hf(j); })
                .find("shared_expert_intermediate_size"),
            std::string::npos);
  j = hf_config("qwen3_moe");
  j["num_experts"] = 6;
  EXPECT_NE(error_of([&] { model_family_for_hf("qwen3_moe").config_from_hf(j); })
                .find("num_experts 6 and num_local_experts 4 disagree"),
            std::string::npos);
  j = hf_config("qwen3_moe");
  j["mlp_only_layers"] = {5};
  EXPECT_NE(error_of([&] { model_family_for_hf("qwen3_moe").config_from_hf(j); })
                .find("mlp_only_layers names layer 5"),
            std::string::npos);
}

TEST(MoeBadInput, Qwen2MoeFieldsThatChangeTheComputationAreHonouredOrRefusedByName) {
  const nlohmann::json base = hf_config("qwen2_moe");
  const ModelConfig c = model_family_for_hf("qwen2_moe").config_from_hf(base);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 36);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.moe.mlp_only_layers, std::vector<int>{1});
  nlohmann::json j = base;
  j["qkv_bias"] = false;
  EXPECT_FALSE(model_family_for_hf("qwen2_moe").config_from_hf(j).qkv_bias);
  j = base;
  j["decoder_sparse_step"] = 2;
  EXPECT_EQ(model_family_for_hf("qwen2_moe").config_from_hf(j).moe.sparse_layers(2), 0);
  j = base;
  j["shared_expert_intermediate_size"] = 0;
  EXPECT_NE(error_of([&] { model_family_for_hf("qwen2_moe").config_from_hf(j); })
                .find("qwen2_moe: shared_expert_intermediate_size must be positive"),
            std::string::npos);
  j = base;
  j["use_sliding_window"] = true;
  EXPECT_NE(error_of([&] { model_family_for_hf("qwen2_moe").config_from_hf(j); }).find("use_sliding_window"),
            std::string::npos);
  j = base;
  j["router_jitter_noise"] = 0.1;
  EXPECT_NE(error_of([&] { model_family_for_hf("qwen2_moe").config_from_hf(j); }).find("router_jitter_noise"),
            std::string::npos);
  ModelConfig shared = model_preset("qwen3-moe-tiny");
  shared.moe.shared_expert_intermediate_size = 16;
  EXPECT_NE(error_of([&] { shared.validate(); }).find("is qwen2_moe's; qwen3_moe has none"), std::string::npos);
}

TEST(MoePlan, TheTracedStepOnTheMetaDevicePlansTheStrategysAndTheModelsBytes) {
  // plan_run runs the real step on the meta device (traced_step, where routing has no
  // contents: every expert gets an equal share); its memory per category must be the
  // arithmetic the strategy and the model allocate by (plan_buffers, plan_memory).
  for (const char* preset : {"qwen3-moe-tiny", "mixtral-tiny", "qwen2-moe-tiny"})
    for (const StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero3})
      for (const DType precision : {DType::fp32, DType::bf16})
        for (const bool checkpointing : {false, true}) {
        RunPlanRequest r;
        r.model.activation_checkpointing = checkpointing;
        r.config = model_preset(preset);
        r.world_size = 2;
        r.strategy.kind = kind;
        r.strategy.param_dtype = precision;
        r.model.precision = precision;
        r.micro_batch = 2;
        r.seq_len = 32;
        const RunPlan traced = plan_run(r);
        const ParamLayout layout = ParamLayout::build(r.config, 2, r.min_unit_params);
        const ModelFamily& family = model_family(r.config.family);
        const StrategyBufferPlan buffers =
            FlatUnitStrategy::plan_buffers(layout, family.unit_needs(r.config), r.strategy);
        const ModelMemoryPlan model = family.plan_memory(r.config, r.micro_batch, r.seq_len, r.model,
                                                         buffers.param_type != DType::fp32);
        const std::string what = std::string(preset) + " " + to_string(kind) + " " +
                                 std::string(dtype_name(precision)) + (checkpointing ? " ckpt" : "");
        EXPECT_EQ(traced.params, buffers.params_bytes + model.params_scratch) << what;
        EXPECT_EQ(traced.grads, buffers.grads_bytes) << what;
        EXPECT_EQ(traced.optimizer, buffers.optimizer_bytes) << what;
        EXPECT_EQ(traced.activations, model.activations) << what;
        EXPECT_EQ(traced.comm, static_cast<int64_t>(r.comm_scratch_bytes)) << what;
        EXPECT_GT(traced.wire_bytes_per_step, 0) << what;
      }
}

TEST(MoePresets, PlanningShapesHaveThePublishedParameterCounts) {
  // Qwen3-30B-A3B: 30.5B parameters, 3.3B active; Mixtral-8x7B: 46.7B, 12.9B active;
  // Qwen1.5-MoE-A2.7B: 14.3B, 2.7B active (their model cards).
  EXPECT_NEAR(static_cast<double>(model_preset("qwen3-30b-a3b").num_parameters()), 30.53e9, 0.01e9);
  EXPECT_NEAR(static_cast<double>(model_preset("mixtral-8x7b").num_parameters()), 46.70e9, 0.01e9);
  const ModelConfig qwen15 = model_preset("qwen1.5-moe-a2.7b");
  EXPECT_NEAR(static_cast<double>(qwen15.num_parameters()), 14.3e9, 0.05e9);
  // Its published config.json: 60 experts of 1408, top-4 not renormalised, a shared
  // expert of 5632, q/k/v biases, every layer sparse.
  EXPECT_EQ(qwen15.moe.num_experts, 60);
  EXPECT_EQ(qwen15.moe.top_k, 4);
  EXPECT_EQ(qwen15.moe.expert_intermediate_size, 1408);
  EXPECT_EQ(qwen15.moe.shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(qwen15.moe.norm_topk_prob);
  EXPECT_TRUE(qwen15.qkv_bias);
  EXPECT_EQ(qwen15.moe.sparse_layers(qwen15.n_layer), 24);
}

}  // namespace
