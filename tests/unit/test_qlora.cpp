// QLoRA's layout and init: the frozen base's linear weights are NF4 tensors occupying
// their storage words in raw units (never merged with fp32 units), everything else is
// as LoRA has it; an NF4 tensor's init is the LoRA run's fp32 init quantized, whatever
// slice of the unit a rank initialises; strategies keep raw units as words (no compute
// copy), which the buffer plan counts.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

using namespace shardlm;

namespace {

ModelConfig qlora_config(const std::string& preset, BaseQuant quant) {
  ModelConfig c = model_preset(preset);
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "v_proj"};
  c.quantize_base = quant;
  c.validate();
  return c;
}

bool is_linear(const std::string& name) {
  for (const char* m : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                        "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    if (name.size() > std::strlen(m) && name.ends_with(m) && name.find("lora_") == std::string::npos)
      return true;
  return false;
}

std::vector<float> unit_init(const UnitLayout& u, int64_t begin, int64_t end) {
  std::vector<float> out(static_cast<size_t>(end - begin));
  init_param_range(u, 1234, begin, end, out.data());
  return out;
}

TEST(QLoraLayout, LinearWeightsAreNf4InRawUnits) {
  for (const char* preset : {"llama-tiny", "qwen2-tiny", "qwen3-tiny"}) {
    SCOPED_TRACE(preset);
    const ModelConfig q = qlora_config(preset, BaseQuant::nf4);
    const ModelConfig l = qlora_config(preset, BaseQuant::none);
    EXPECT_EQ(q.num_parameters(), l.num_parameters()) << "values, not storage words";
    for (int64_t min_unit : {int64_t{0}, int64_t{1} << 40}) {
      const ParamLayout layout = ParamLayout::build(q, 2, min_unit);
      int quantized = 0;
      for (const auto& u : layout.units) {
        bool any_nf4 = false;
        for (const auto& p : u.params) {
          ASSERT_EQ(p.quantized(), is_linear(p.name)) << p.name;
          if (!p.quantized()) {
            EXPECT_EQ(p.numel, p.logical_numel()) << p.name;
            continue;
          }
          any_nf4 = true;
          ++quantized;
          EXPECT_EQ(p.numel, cpu::nf4_storage_words(p.logical_numel())) << p.name;
          EXPECT_EQ(p.offset % ParamLayout::kParamAlignment, 0) << p.name;
          EXPECT_FALSE(p.weight_decay) << p.name;
        }
        // A raw unit is all of a frozen layer (its norms are ordinary fp32 tensors).
        EXPECT_EQ(u.raw, any_nf4) << u.name;
        if (u.raw) {
          EXPECT_FALSE(u.trainable) << u.name;
        }
        EXPECT_EQ(u.padded_numel % (2 * ParamLayout::kParamAlignment), 0);
      }
      EXPECT_EQ(quantized, 7 * q.n_layer);
    }
  }
}

TEST(QLoraLayout, Nf4InitIsTheFp32InitQuantized) {
  const ModelConfig q = qlora_config("qwen3-tiny", BaseQuant::nf4);
  const ModelConfig l = qlora_config("qwen3-tiny", BaseQuant::none);
  const ParamLayout lq = ParamLayout::build(q, 2), ll = ParamLayout::build(l, 2);
  for (const auto& u : lq.units) {
    if (!u.raw) continue;
    const std::vector<float> whole = unit_init(u, 0, u.padded_numel);
    // Two ranks' halves, and an odd split, give the same words.
    const int64_t half = u.padded_numel / 2, odd = 37;
    std::vector<float> a = unit_init(u, 0, half), b = unit_init(u, half, u.padded_numel);
    a.insert(a.end(), b.begin(), b.end());
    std::vector<float> c = unit_init(u, 0, odd), d = unit_init(u, odd, u.padded_numel);
    c.insert(c.end(), d.begin(), d.end());
    ASSERT_EQ(std::memcmp(whole.data(), a.data(), whole.size() * 4), 0) << u.name;
    ASSERT_EQ(std::memcmp(whole.data(), c.data(), whole.size() * 4), 0) << u.name;
    for (const auto& p : u.params) {
      const auto [lu, lp] = ll.find(p.name);
      const UnitLayout& lora_unit = ll.units[static_cast<size_t>(lu)];
      const std::vector<float> fp32 = unit_init(lora_unit, lp->offset, lp->offset + lp->numel);
      if (!p.quantized()) {
        EXPECT_EQ(std::memcmp(fp32.data(), whole.data() + p.offset, fp32.size() * 4), 0) << p.name;
        continue;
      }
      std::vector<float> words(static_cast<size_t>(p.numel));
      cpu::nf4_quantize(fp32.data(), p.logical_numel(), words.data());
      EXPECT_EQ(std::memcmp(words.data(), whole.data() + p.offset, words.size() * 4), 0) << p.name;
    }
  }
}

TEST(QLoraLayout, StrategiesKeepRawUnitsAsWords) {
  const ModelConfig q = qlora_config("llama-tiny", BaseQuant::nf4);
  const ParamLayout layout = ParamLayout::build(q, 2);
  const auto needs = model_family(q.family).unit_needs(q);
  int64_t raw_words = 0, other_frozen = 0, largest_raw = 0, largest_other = 0;
  for (const auto& u : layout.units) {
    if (u.trainable) continue;
    (u.raw ? raw_words : other_frozen) += u.padded_numel;
    (u.raw ? largest_raw : largest_other) = std::max(u.raw ? largest_raw : largest_other, u.padded_numel);
  }
  ASSERT_GT(raw_words, 0);
  StrategyOptions ddp;
  ddp.kind = StrategyKind::ddp;
  ddp.param_dtype = DType::bf16;
  // Replicated: raw units as fp32 words only; other frozen units (embeddings, final
  // norm, head) stored once in bf16.
  EXPECT_EQ(FlatUnitStrategy::plan_buffers(layout, needs, ddp).frozen_bytes,
            4 * raw_words + 2 * other_frozen);
  StrategyOptions zero3 = ddp;
  zero3.kind = StrategyKind::zero3;
  const StrategyBufferPlan z = FlatUnitStrategy::plan_buffers(layout, needs, zero3);
  EXPECT_EQ(z.frozen_bytes, (4 * raw_words + 2 * other_frozen) / 2);
  // A gather buffer holds the largest unit as the model reads it: words, or bf16.
  EXPECT_GE(z.gather_buffer_bytes, std::max(4 * largest_raw, 2 * largest_other));
}

TEST(QLoraConfig, RecordedAndRefused) {
  const ModelConfig q = qlora_config("qwen2-tiny", BaseQuant::nf4);
  EXPECT_EQ(q.to_json().at("quantize_base"), "nf4");
  EXPECT_EQ(ModelConfig::from_json(q.to_json()), q);
  EXPECT_FALSE(qlora_config("qwen2-tiny", BaseQuant::none).to_json().contains("quantize_base"));
  ModelConfig no_lora = model_preset("qwen2-tiny");
  no_lora.quantize_base = BaseQuant::nf4;
  EXPECT_THROW(no_lora.validate(), std::exception);
  EXPECT_THROW(parse_base_quant("nf8"), std::exception);
}

}  // namespace
