#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/model/param_layout.hpp"

using namespace shardlm;

namespace {
ModelConfig small_config() {
  ModelConfig c = model_preset("gpt2-tiny");
  c.vocab_size = 67;
  return c;
}
}  // namespace

TEST(ParamLayout, UnitsAndHuggingFaceNames) {
  ModelConfig c = small_config();
  ParamLayout layout = ParamLayout::build(c, 1);
  ASSERT_EQ(layout.num_units(), c.n_layer + 2);
  EXPECT_EQ(layout.units[0].name, "embeddings");
  EXPECT_EQ(layout.units[1].params[2].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(layout.units[1].params[2].shape, (std::vector<int64_t>{c.n_embd, 3 * c.n_embd}));
  EXPECT_EQ(layout.units.back().params[0].name, "transformer.ln_f.weight");
  auto [unit, wte] = layout.find("transformer.wte.weight");
  EXPECT_EQ(unit, 0);
  EXPECT_EQ(wte->shape[0], 128);  // 67 padded to a multiple of 64
  EXPECT_EQ(wte->valid_rows, 67);
  EXPECT_THROW(layout.find("transformer.nope"), Error);
}

TEST(ParamLayout, OffsetsAlignedAndNonOverlapping) {
  for (int world : {1, 2, 3, 4, 7}) {
    ParamLayout layout = ParamLayout::build(small_config(), world);
    for (const auto& unit : layout.units) {
      int64_t end = 0;
      for (const auto& p : unit.params) {
        EXPECT_EQ(p.offset % ParamLayout::kParamAlignment, 0) << p.name;
        EXPECT_GE(p.offset, end) << p.name;
        end = p.offset + p.numel;
      }
      EXPECT_EQ(unit.numel, end);
      EXPECT_EQ(unit.padded_numel % (world * ParamLayout::kParamAlignment), 0);
      EXPECT_GE(unit.padded_numel, unit.numel);
      EXPECT_LT(unit.padded_numel - unit.numel, world * ParamLayout::kParamAlignment);
      EXPECT_EQ(unit.shard_numel(world) * world, unit.padded_numel);
    }
  }
}

TEST(ParamLayout, ParameterCountMatchesConfig) {
  ModelConfig c = model_preset("gpt2");
  ParamLayout layout = ParamLayout::build(c, 1);
  // Hugging Face's GPT-2 small has 124,439,808 parameters; the layout stores the
  // vocabulary padded to 50304 rows (47 extra rows of 768).
  EXPECT_EQ(c.num_parameters(), 124439808);
  EXPECT_EQ(layout.total_numel(), 124439808 + 47 * 768);
}

TEST(ParamLayout, WeightDecayOnTwoDimensionalWeightsOnly) {
  ParamLayout layout = ParamLayout::build(small_config(), 1);
  for (const auto* p : layout.all_params())
    EXPECT_EQ(p->weight_decay, p->shape.size() == 2) << p->name;
}

TEST(ModelConfig, RejectsBadShapes) {
  ModelConfig c = small_config();
  c.n_head = 3;  // 128 % 3 != 0
  EXPECT_THROW(c.validate(), Error);
  c = small_config();
  c.n_layer = 0;
  EXPECT_THROW(c.validate(), Error);
  c = small_config();
  c.vocab_size = -5;
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(model_preset("gpt5"), Error);
}

TEST(ModelConfig, JsonRoundTrip) {
  ModelConfig c = small_config();
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  auto j = c.to_json();
  j.erase("n_head");
  EXPECT_THROW(ModelConfig::from_json(j), Error);
}

TEST(ParamLayout, SmallModelUnitsMergeWithANeighbour) {
  ModelConfig c = model_preset("gpt2");
  ParamLayout separate = ParamLayout::build(c, 2, 0);
  ParamLayout merged = ParamLayout::build(c, 2, 65536);
  ASSERT_EQ(separate.num_units(), c.n_layer + 2);
  // The final norm (2 x 768 values) joins the last block; nothing else merges.
  ASSERT_EQ(merged.num_units(), c.n_layer + 1);
  ASSERT_EQ(merged.num_model_units(), c.n_layer + 2);
  EXPECT_EQ(merged.units.back().name, "h.11+final");
  EXPECT_EQ(merged.model_units.back().unit, c.n_layer);
  EXPECT_GT(merged.model_units.back().base, 0);
  // A parameter's offset within its model unit does not depend on merging.
  for (int m = 0; m < merged.num_model_units(); ++m)
    for (const auto& p : separate.units[static_cast<size_t>(m)].params)
      EXPECT_EQ(merged.offset_in_model_unit(m, p.name), separate.offset_in_model_unit(m, p.name))
          << p.name;
  EXPECT_EQ(merged.total_numel(), separate.total_numel());
  // Tiny models merge whole runs of units; every unit still pads to 2 x alignment.
  ModelConfig tiny = model_preset("gpt2-tiny");
  tiny.vocab_size = 256;
  ParamLayout t = ParamLayout::build(tiny, 2, 1 << 20);
  EXPECT_EQ(t.num_units(), 1);
  EXPECT_EQ(t.units[0].padded_numel % (2 * ParamLayout::kParamAlignment), 0);
  EXPECT_THROW(ParamLayout::build(tiny, 2, -1), Error);
}
