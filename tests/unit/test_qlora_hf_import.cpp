// QLoRA from a Hugging Face directory: a LoRA run with --quantize-base nf4 takes its
// base from the tiny transformers models of tests/fixtures/hf (llama: bf16 storage,
// qwen2: sharded with an index, qwen3), and every linear weight it quantizes on load
// (and the mixtures of experts qwen3_moe, mixtral, qwen2_moe: every expert's weights, the
// shared expert's, the attention; the routers stay fp32)
// is bit for bit what bitsandbytes' published NF4 algorithm gives offline
// (tools/make_nf4_reference.py, written from the algorithm, not from shardlm's code:
// tests/fixtures/hf/nf4_reference.safetensors). The directory's config.json (which
// knows nothing of quantization or adapters) matches the run's model.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

namespace fs = std::filesystem;
namespace st = shardlm::safetensors;
using namespace shardlm;

namespace {

const fs::path kHfDir = fs::path(SHARDLM_FIXTURE_DIR) / "hf";

ModelConfig qlora_of(const std::string& dir) {
  ModelConfig c = read_hf_model_config(dir);
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  if (c.moe.enabled())  // a mixture of experts: its attention and routed experts
    c.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "experts.gate_up_proj", "experts.down_proj"};
  c.quantize_base = BaseQuant::nf4;
  c.validate();
  return c;
}

// The reference's absmax words, then its packed codes, zero-padded to whole words: the
// storage layout docs/qlora.md describes (bitsandbytes' nibble order).
std::vector<uint32_t> reference_words(const st::File& ref, const std::string& key) {
  const st::Tensor& absmax = ref.at(key + ".absmax");
  const st::Tensor& codes = ref.at(key + ".codes");
  EXPECT_EQ(absmax.dtype, st::DType::F32);
  EXPECT_EQ(codes.dtype, st::DType::U8);
  std::vector<std::byte> bytes(absmax.data);
  bytes.insert(bytes.end(), codes.data.begin(), codes.data.end());
  bytes.resize((bytes.size() + 3) / 4 * 4, std::byte{0});
  std::vector<uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
}

class QLoraFromHf : public ::testing::TestWithParam<std::string> {};

TEST_P(QLoraFromHf, ImportedBaseIsBitsandbytesNf4OfTheWeights) {
  const std::string dir = (kHfDir / GetParam()).string();
  const ModelConfig config = qlora_of(dir);
  EXPECT_NO_THROW(check_hf_model_matches(dir, config));
  const st::File ref = st::read_file((kHfDir / "nf4_reference.safetensors").string());
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero3}) {
    SCOPED_TRACE(to_string(kind));
    const ParamLayout layout = ParamLayout::build(config, 1);
    SingleProcessCommunicator comm;
    StrategyOptions options;
    options.kind = kind;
    options.param_dtype = DType::bf16;
    FlatUnitStrategy strategy(layout, model_family(config.family).unit_needs(config), comm, options);
    import_hugging_face(dir, config, layout, strategy);
    int compared = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      const UnitLayout& unit = layout.units[static_cast<size_t>(u)];
      const OwnedSlice s = strategy.owned(u);
      for (const ParamInfo& p : unit.params) {
        if (!p.quantized()) continue;
        ASSERT_TRUE(unit.raw && !unit.trainable) << p.name;
        ASSERT_NE(s.master, nullptr) << p.name;
        const std::vector<uint32_t> want = reference_words(ref, GetParam() + "/" + p.name);
        ASSERT_EQ(static_cast<int64_t>(want.size()), p.numel) << p.name;
        std::vector<uint32_t> got(want.size());
        std::memcpy(got.data(), s.master + (p.offset - s.begin), got.size() * sizeof(uint32_t));
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << p.name << " word " << i;
        ++compared;
      }
    }
    int references = 0;  // every weight the reference quantized (the routers it leaves fp32)
    for (const auto& [name, t] : ref.tensors)
      references += name.rfind(GetParam() + "/", 0) == 0 && name.ends_with(".absmax");
    EXPECT_EQ(compared, references);
    if (!config.moe.enabled()) {
      EXPECT_EQ(compared, 7 * config.n_layer);
    }
  }
}

TEST_P(QLoraFromHf, ConfigStillMustDescribeTheModel) {
  const std::string dir = (kHfDir / GetParam()).string();
  ModelConfig other = qlora_of(dir);
  other.n_layer += 1;
  EXPECT_THROW(check_hf_model_matches(dir, other), Error);
}

INSTANTIATE_TEST_SUITE_P(Families, QLoraFromHf,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
