// LoRA on mixture-of-experts models against PyPI PEFT 0.21 on transformers' own MoE
// models in float64 (tools/make_moe_lora_fixture.py): the routed experts adapted as
// PEFT's target_parameters adapts transformers 5's fused experts (one A for gate and up
// per expert), next to attention adapters, and (qwen2_moe_mlp) the dense layers' MLP and
// the shared experts' gate_proj/up_proj/down_proj. Loss with the aux loss, logits, every adapter
// gradient within 1e-5 of its tensor's scale, the frozen base untouched; three AdamW
// steps through the real strategy and optimizer; the PEFT export gives back PEFT's own
// fused tensors bitwise with its target_parameters; the merged export is the base plus
// (alpha / r) B A and gives PEFT's logits; QLoRA (NF4 base) is LoRA on the
// dequantized base bitwise; bad input refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "llama_fixture_support.hpp"
#include "relative_error.hpp"
#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_export.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/llama/llama_lora.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

namespace fs = std::filesystem;
using namespace shardlm;
using namespace shardlm::testing;

namespace {

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}


class MoeLora : public ::testing::TestWithParam<std::string> {};

// An empty directory of this process under the system's temporary directory.
fs::path fresh_work_dir(const std::string& name) {
  const fs::path work = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(work);
  return work;
}

// The fixture's config, its base stored NF4 (QLoRA) when nf4.
ModelConfig fixture_config(const Reference& ref, bool nf4) {
  ModelConfig c = ref.config;
  if (nf4) c.quantize_base = BaseQuant::nf4;
  c.validate();
  return c;
}

// The fixture's base and adapters as a committed checkpoint under `work`/run (nf4: each
// quantized weight's NF4 words of the fixture's values); a train record without options,
// as a tool writes one (export names no source directory).
std::string save_fixture_checkpoint(const Reference& ref, const fs::path& work, bool nf4 = false) {
  const ModelConfig config = fixture_config(ref, nf4);
  const ParamLayout layout = ParamLayout::build(config, 1);
  SingleProcessCommunicator comm;
  auto model = model_family(config.family).make_model(config, layout, ref.B, ref.T, {}, MemoryTracker::global());
  FlatUnitStrategy strategy(layout, model->unit_needs(), comm, StrategyOptions{});
  if (!nf4) load_fixture_weights(layout, strategy, ref.file);
  for (const auto* p : nf4 ? layout.all_params() : std::vector<const ParamInfo*>{}) {
    const auto [unit, info] = layout.find(p->name);
    const std::vector<float> values = ref.file.at(p->name).to_f32();
    float* master = strategy.owned(unit).master + info->offset;
    if (info->quantized()) {
      cpu::nf4_quantize(values.data(), info->logical_numel(), master);
    } else {
      const std::vector<float> rows = padded(*info, values);
      std::copy(rows.begin(), rows.end(), master);
    }
  }
  if (nf4) strategy.after_load();
  CheckpointInfo info{0, 0, config, "byte", "ddp", 1, nlohmann::json::object()};
  return save_checkpoint((work / "run").string(), layout, strategy, info, 0, comm);
}

// The base weight `name` as a run computes with it: the fixture's values, or (nf4) their
// NF4 words dequantized where the layout quantizes them.
std::vector<float> base_values(const Reference& ref, const ParamLayout& layout, const std::string& name) {
  std::vector<float> values = ref.file.at(name).to_f32();
  const ParamInfo& info = *layout.find(name).second;
  if (!info.quantized()) return values;
  std::vector<float> words(static_cast<size_t>(info.numel));
  cpu::nf4_quantize(values.data(), info.logical_numel(), words.data());
  cpu::nf4_dequantize(words.data(), info.logical_numel(), TypedPtr(values.data(), DType::fp32));
  return values;
}

HfExportOptions fp32_export(const fs::path& out, LoraExport lora) {
  HfExportOptions options;
  options.out_dir = out.string();
  options.lora = lora;
  options.dtype = DType::fp32;
  options.max_shard_bytes = 5'000'000'000;
  return options;
}

TEST_P(MoeLora, LossLogitsAndEveryAdapterGradientMatchPeft) {
  const Reference ref = load_reference("lora_" + GetParam());
  ASSERT_TRUE(llama_expert_lora(ref.config));
  const auto layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  UnitBuffers buf(layout, ref.file);
  train_micro_batch(*model, buf, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
  const double ce = model->last_loss_sum() / static_cast<double>(ref.count);
  EXPECT_NEAR(ce, ref.file.at("ce_loss").to_f32()[0], 1e-5 * ce);
  const double aux = model->last_aux_loss();
  EXPECT_NEAR(aux, ref.file.at("aux_loss").to_f32()[0], 1e-5 * aux);
  const double loss = ce + ref.config.moe.aux_loss_coef() * aux;
  EXPECT_NEAR(loss, ref.file.at("loss").to_f32()[0], 1e-5 * loss);
  int adapters = 0, expert_adapters = 0;
  double worst_grad = 0.0;
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    if (!is_adapter(p->name)) {
      ASSERT_FALSE(layout.units[unit].trainable) << p->name << " belongs to the frozen base";
      continue;
    }
    ++adapters;
    ASSERT_TRUE(layout.units[unit].trainable) << p->name;
    if (p->name.find(".experts.") != std::string::npos) {
      ++expert_adapters;
      EXPECT_GE(layout.units[unit].expert, 0) << p->name << " travels with its expert";
    }
    const double error = relative_to_max_error(buf.grad(layout, p->name), ref.file.at(p->name + ".grad").to_f32());
    worst_grad = std::max(worst_grad, error);
    EXPECT_LT(error, 1e-5) << p->name;
  }
  int fixture_adapters = 0;
  for (const auto& [name, t] : ref.file.tensors)
    fixture_adapters += is_adapter(name) && name.rfind("peft.", 0) != 0 && name.find(".lora_") + 14 == name.size();
  EXPECT_EQ(adapters, fixture_adapters);
  EXPECT_GT(expert_adapters, 0);
  for (int u = 0; u < layout.num_units(); ++u) {
    if (layout.units[u].trainable) continue;
    for (float g : buf.grads[u]) ASSERT_EQ(g, 0.0f) << layout.units[u].name;
  }

  const double logits_error = relative_to_max_error(fixture_logits(*model, buf, ref), ref.file.at("logits").to_f32());
  EXPECT_LT(logits_error, 1e-5);
  std::printf("%s: loss %.9g (PEFT %.9g), %d adapter gradients within %.2g of PEFT's, logits within %.2g\n",
              GetParam().c_str(), loss, ref.file.at("loss").to_f32()[0], adapters, worst_grad, logits_error);
}

TEST_P(MoeLora, CheckpointingAndBf16ChangeNoBitOfTheRecompute) {
  // Activation checkpointing recomputes each expert's g|u with its adapter: the
  // gradients are bitwise those without it, in fp32 and bf16.
  const Reference ref = load_reference("lora_" + GetParam());
  const auto layout = ParamLayout::build(ref.config, 1);
  for (const DType precision : {DType::fp32, DType::bf16}) {
    auto plain = make_model(ref, layout, ref.B, {precision, false});
    auto recompute = make_model(ref, layout, ref.B, {precision, true});
    UnitBuffers a(layout, ref.file), b(layout, ref.file);
    train_micro_batch(*plain, a, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
    train_micro_batch(*recompute, b, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
    EXPECT_EQ(plain->last_loss_sum(), recompute->last_loss_sum());
    for (const auto* p : layout.all_params())
      if (is_adapter(p->name)) {
        EXPECT_EQ(a.grad(layout, p->name), b.grad(layout, p->name)) << p->name;
      }
  }
}

TEST_P(MoeLora, ThreeAdamWStepsOnTheAdaptersMatchPeft) {
  const Reference ref = load_reference("lora_" + GetParam());
  const auto hp = nlohmann::json::parse(ref.file.metadata.at("adamw"));
  const ParamLayout layout = ParamLayout::build(ref.config, 1);
  auto model = make_model(ref, layout, ref.B);
  MemoryTracker tracker;
  SingleProcessCommunicator comm;
  FlatUnitStrategy strategy(layout, model->unit_needs(), comm, StrategyOptions{}, tracker);
  load_fixture_weights(layout, strategy, ref.file);
  int64_t adapter_elements = 0;
  for (const auto& unit : layout.units)
    if (unit.trainable) adapter_elements += unit.padded_numel;
  EXPECT_EQ(tracker.peak(MemCategory::optimizer), static_cast<size_t>(8 * adapter_elements));
  run_moe_three_adamw_steps(ref, *model, strategy, layout);
  const float lr = hp.at("lr").get<float>();
  expect_weights_after_three_steps(layout, strategy, ref.file, lr, hp.at("weight_decay").get<float>(), 90,
                                   is_adapter);
  for (const auto* p : layout.all_params()) {
    if (is_adapter(p->name)) continue;
    const auto [unit, info] = layout.find(p->name);
    const auto start = padded(*info, ref.file.at(p->name).to_f32());
    const float* got = strategy.owned(unit).master + info->offset;
    for (size_t i = 0; i < start.size(); ++i) ASSERT_EQ(got[i], start[i]) << p->name << " is frozen";
  }
}

TEST_P(MoeLora, PeftExportIsPeftsOwnFusedTensors) {
  const Reference ref = load_reference("lora_" + GetParam());
  const fs::path work = fresh_work_dir("shardlm-moe-lora-" + GetParam());
  const std::string ckpt = save_fixture_checkpoint(ref, work);
  export_hugging_face(CheckpointReader(ckpt), fp32_export(work / "adapter", LoraExport::automatic));
  const st::File exported = st::read_file((work / "adapter" / "adapter_model.safetensors").string());
  int peft_tensors = 0;
  for (const auto& [name, tensor] : ref.file.tensors) {
    if (name.rfind("peft.", 0) != 0) continue;
    ++peft_tensors;
    const std::string saved = name.substr(5);
    ASSERT_TRUE(exported.tensors.count(saved)) << saved << " missing from the export";
    EXPECT_EQ(exported.at(saved).shape, tensor.shape) << saved;
    EXPECT_EQ(exported.at(saved).to_f32(), tensor.to_f32()) << saved;
  }
  EXPECT_EQ(static_cast<int>(exported.tensors.size()), peft_tensors) << "exactly PEFT's tensors";
  const auto config = nlohmann::json::parse(std::ifstream(work / "adapter" / "adapter_config.json"));
  const auto peft = nlohmann::json::parse(ref.file.metadata.at("peft_config"));
  auto sorted = [](const nlohmann::json& j) {
    std::vector<std::string> v = j.get<std::vector<std::string>>();
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(config.at("target_modules")), sorted(peft.at("target_modules")));
  EXPECT_EQ(sorted(config.at("target_parameters")), sorted(peft.at("target_parameters")));
  EXPECT_EQ(config.at("r"), peft.at("r"));
  EXPECT_EQ(config.at("lora_alpha").get<double>(), peft.at("lora_alpha").get<double>());
  fs::remove_all(work);
}

// The base weight an adapter of the fixture merges into, and B's rows that land in it:
// an expert's gate_up_proj adapter splits over its gate (w1) and up (w3) weights,
// transformers' fused gate_up_proj being [gate; up] (its forward's chunk(2)).
struct MergeTarget {
  std::string weight;
  int64_t b_row_offset;
};
std::vector<MergeTarget> merge_targets(const ModelConfig& c, const std::string& lora_a) {
  const std::string module = lora_a.substr(0, lora_a.size() - std::string(".lora_A.weight").size());
  const size_t experts = module.find(".mlp.experts.");
  if (experts == std::string::npos) return {{module + ".weight", 0}};
  const bool mixtral = c.family == "mixtral";
  const std::string prefix = module.substr(0, module.rfind('.') + 1);  // "...experts.N."
  const std::string expert = mixtral ? std::string(prefix).replace(experts, 4, ".block_sparse_moe") : prefix;
  if (module.ends_with(".down_proj")) return {{expert + (mixtral ? "w2" : "down_proj") + ".weight", 0}};
  const int64_t I = c.moe.expert_intermediate_size;
  return {{expert + (mixtral ? "w1" : "gate_proj") + ".weight", 0},
          {expert + (mixtral ? "w3" : "up_proj") + ".weight", I}};
}

// export --merge-lora of expert adapters: every adapted weight is the base (nf4: its NF4
// words dequantized) plus (alpha / r) B A (a naive float64 loop here), every other base
// tensor is the base's bitwise, no adapter is left; returns the merged export.
st::File expect_merged_export(const std::string& fixture, const Reference& ref, const fs::path& work, bool nf4) {
  const std::string ckpt = save_fixture_checkpoint(ref, work, nf4);
  const ParamLayout layout = ParamLayout::build(fixture_config(ref, nf4), 1);
  export_hugging_face(CheckpointReader(ckpt), fp32_export(work / "merged", LoraExport::merge));
  const st::File merged = st::read_file((work / "merged" / "model.safetensors").string());
  const double scale = ref.config.lora.alpha / ref.config.lora.rank;
  std::map<std::string, std::vector<double>> want;  // adapted weights, float64
  int expert_weights = 0;
  for (const auto& [name, t] : ref.file.tensors) {
    if (!name.ends_with(".lora_A.weight") || name.rfind("peft.", 0) == 0) continue;
    const std::vector<float> a = t.to_f32();
    const std::vector<float> b = ref.file.at(name.substr(0, name.size() - 14) + ".lora_B.weight").to_f32();
    const int64_t r = t.shape[0], in = t.shape[1];
    for (const MergeTarget& target : merge_targets(ref.config, name)) {
      EXPECT_TRUE(ref.file.tensors.count(target.weight)) << target.weight << " (from " << name << ")";
      const std::vector<float> w = base_values(ref, layout, target.weight);
      const int64_t rows = ref.file.at(target.weight).shape[0];
      EXPECT_EQ(ref.file.at(target.weight).shape[1], in) << target.weight;
      std::vector<double>& sum = want[target.weight];
      sum.assign(w.begin(), w.end());
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t i = 0; i < in; ++i)
          for (int64_t j = 0; j < r; ++j)
            sum[static_cast<size_t>(o * in + i)] +=
                scale * b[static_cast<size_t>((o + target.b_row_offset) * r + j)] * a[static_cast<size_t>(j * in + i)];
      expert_weights += target.weight.find(".experts.") != std::string::npos;
    }
  }
  EXPECT_GT(expert_weights, 0);
  int quantized = 0, base_tensors = 0;
  double worst_weight = 0.0;
  for (const auto* p : layout.all_params()) {
    if (is_adapter(p->name)) continue;
    ++base_tensors;
    quantized += p->quantized();
    EXPECT_TRUE(merged.tensors.count(p->name)) << p->name << " missing from the merged export";
    if (!merged.tensors.count(p->name)) continue;
    const std::vector<float> got = merged.at(p->name).to_f32();
    const std::vector<float> base = base_values(ref, layout, p->name);
    auto it = want.find(p->name);
    if (it == want.end()) {
      EXPECT_EQ(got, base) << p->name << " is not adapted";
      continue;
    }
    const double error = relative_to_max_error(got, it->second);
    worst_weight = std::max(worst_weight, error);
    EXPECT_LT(error, 1e-6) << p->name;
    EXPECT_NE(got, base) << p->name << " has its adapter merged in";
  }
  EXPECT_EQ(static_cast<int>(merged.tensors.size()), base_tensors) << "the base's tensors, no adapter";
  EXPECT_EQ(quantized > 0, nf4);
  std::printf("%s%s merged: %zu adapted weights within %.2g of the float64 sum\n", nf4 ? "QLoRA " : "",
              fixture.c_str(), want.size(), worst_weight);
  return merged;
}

// ... and the merged model without LoRA gives the logits of PEFT's unmerged model with
// its adapters (float64, the fixture's).
TEST_P(MoeLora, MergedExportIsTheBasePlusScaledBAAndGivesPeftsLogits) {
  const Reference ref = load_reference("lora_" + GetParam());
  const fs::path work = fresh_work_dir("shardlm-moe-merge-" + GetParam());
  const st::File merged = expect_merged_export(GetParam(), ref, work, /*nf4=*/false);
  const ModelConfig base_config = [&] {
    ModelConfig c = ref.config;
    c.lora = LoraConfig{};
    return c;
  }();
  const ParamLayout base_layout = ParamLayout::build(base_config, 1);
  Reference plain = ref;
  plain.config = base_config;
  auto model = make_model(plain, base_layout, ref.B);
  UnitBuffers buf(base_layout, merged);
  const double logits_error = relative_to_max_error(fixture_logits(*model, buf, plain), ref.file.at("logits").to_f32());
  EXPECT_LT(logits_error, 1e-5);
  std::printf("%s merged: logits within %.2g of PEFT's\n", GetParam().c_str(), logits_error);
  fs::remove_all(work);
}

// A QLoRA run's merged export: the dequantized NF4 base plus (alpha / r) B A, experts too.
TEST_P(MoeLora, QLoraMergedExportIsTheDequantizedBasePlusScaledBA) {
  const Reference ref = load_reference("lora_" + GetParam());
  const fs::path work = fresh_work_dir("shardlm-moe-qmerge-" + GetParam());
  expect_merged_export(GetParam(), ref, work, /*nf4=*/true);
  fs::remove_all(work);
}

// qwen2_moe_mlp: gate_proj/up_proj/down_proj as PEFT targets them in qwen2_moe, the
// dense layers' MLP and the sparse layers' shared expert, next to q_proj and the experts.
INSTANTIATE_TEST_SUITE_P(Families, MoeLora,
                         ::testing::Values("qwen3_moe", "mixtral", "qwen2_moe", "qwen2_moe_mlp"),
                         [](const auto& info) { return info.param; });

TEST(MoeLoraBadInput, MlpTargetsOfQwen3MoeAndMixtralAreRefusedByName) {
  ModelConfig qwen2 = model_preset("qwen2-moe-tiny");  // dense layers and shared experts
  qwen2.lora.rank = 4;
  qwen2.lora.targets = {"gate_proj", "up_proj", "down_proj"};
  EXPECT_NO_THROW(qwen2.validate());
  ModelConfig mixtral = model_preset("mixtral-tiny");
  mixtral.lora.rank = 4;
  mixtral.lora.targets = {"down_proj"};
  EXPECT_THROW(mixtral.validate(), Error);
  ModelConfig c = model_preset("qwen3-moe-tiny");
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "gate_proj"};
  try {
    c.validate();
    ADD_FAILURE() << "gate_proj in qwen3_moe should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gate_proj'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("experts.gate_up_proj"), std::string::npos) << e.what();
  }
  ModelConfig dense = model_preset("qwen3-tiny");
  dense.lora.rank = 4;
  dense.lora.targets = {"experts.down_proj"};
  try {
    dense.validate();
    ADD_FAILURE() << "expert targets in a dense model should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'experts.down_proj'"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// QLoRA of a mixture of experts: the attention, dense MLP, shared-expert and every
// expert's linear weights stored NF4 (the routers and the shared expert's gate fp32)
// compute exactly what LoRA computes on the dequantized base (fp32: the same values
// in the same GEMMs): loss, aux loss and every adapter gradient bitwise.
TEST_P(MoeLora, QLoraIsLoraOnTheDequantizedBase) {
  const Reference ref = load_reference("lora_" + GetParam());
  ModelConfig qconfig = ref.config;
  qconfig.quantize_base = BaseQuant::nf4;
  qconfig.validate();
  const auto layout = ParamLayout::build(ref.config, 1);
  const auto qlayout = ParamLayout::build(qconfig, 1);
  UnitBuffers lora(layout, ref.file), qlora(qlayout, ref.file);
  int quantized = 0, linear = 0;
  for (const auto* p : qlayout.all_params()) {
    const std::string& n = p->name;
    bool is_linear = false;  // the routers (gate.weight) and shared_expert_gate are not
    for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"})
      is_linear = is_linear || (!is_adapter(n) && n.ends_with(std::string(".") + m + ".weight"));
    linear += is_linear;
    if (!p->quantized()) continue;
    ++quantized;
    EXPECT_TRUE(is_linear) << n << " should stay fp32";
    const auto [unit, info] = qlayout.find(n);
    const std::vector<float> values = ref.file.at(n).to_f32();
    std::vector<float> words(static_cast<size_t>(info->numel));
    cpu::nf4_quantize(values.data(), info->logical_numel(), words.data());
    std::copy(words.begin(), words.end(), qlora.params[unit].begin() + info->offset);
    // The LoRA run's base holds the dequantized values.
    std::vector<float> dequantized(values.size());
    cpu::nf4_dequantize(words.data(), info->logical_numel(), TypedPtr(dequantized.data(), DType::fp32));
    const auto [lunit, linfo] = layout.find(n);
    std::copy(dequantized.begin(), dequantized.end(), lora.params[lunit].begin() + linfo->offset);
  }
  EXPECT_EQ(quantized, linear) << "every linear weight of the base is NF4";
  EXPECT_GT(quantized, 0);
  auto plain = make_model(ref, layout, ref.B);
  auto q = model_family(qconfig.family).make_model(qconfig, qlayout, ref.B, ref.T, {}, MemoryTracker::global());
  train_micro_batch(*plain, lora, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
  train_micro_batch(*q, qlora, moe_fixture_batch(ref), 1.0f / static_cast<float>(ref.count));
  EXPECT_EQ(q->last_loss_sum(), plain->last_loss_sum());
  EXPECT_EQ(q->last_aux_loss(), plain->last_aux_loss());
  int adapters = 0;
  for (const auto* p : layout.all_params())
    if (is_adapter(p->name)) {
      ++adapters;
      EXPECT_EQ(qlora.grad(qlayout, p->name), lora.grad(layout, p->name)) << p->name;
    }
  EXPECT_GT(adapters, 0);
}

}  // namespace
