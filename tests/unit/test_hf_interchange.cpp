// Hugging Face model directories in and out, for every family: directories written by
// transformers' own save_pretrained (tools/make_llama_fixture.py: bf16 storage, sharded
// with an index, untied and tied heads, transformers 5.x config fields) load into a
// model whose logits equal transformers' float64 logits; export writes the same
// tensors back (bitwise for an fp32 round trip) with a config.json that reads back as
// the same model; and every kind of bad input is one clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hf_loaded_model.hpp"
#include "relative_error.hpp"
#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_export.hpp"
#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

namespace fs = std::filesystem;
namespace st = shardlm::safetensors;
using namespace shardlm;
using shardlm::testing_support::HfLoadedModel;

namespace {

const fs::path kHfDir = fs::path(SHARDLM_FIXTURE_DIR) / "hf";


HfExportOptions export_options(const std::string& out, DType dtype, int64_t max_shard_bytes) {
  HfExportOptions o;
  o.out_dir = out;
  o.dtype = dtype;
  o.max_shard_bytes = max_shard_bytes;
  return o;
}

std::vector<int32_t> fixture_tokens() {
  std::vector<int32_t> tokens;
  for (auto v : st::read_file((kHfDir / "hf_logits.safetensors").string()).at("tokens").to_i64())
    tokens.push_back(static_cast<int32_t>(v));
  return tokens;
}

class HfInterchange : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    work_ = fs::temp_directory_path() / ("shardlm-hf-" + GetParam() + "-" + std::to_string(::getpid()));
    fs::remove_all(work_);
    fs::create_directories(work_);
  }
  void TearDown() override { fs::remove_all(work_); }
  fs::path work_;
};

TEST_P(HfInterchange, TransformersDirectoryLoadsWithTransformersLogits) {
  const std::string dir = (kHfDir / GetParam()).string();
  HfLoadedModel loaded(dir, 16);
  EXPECT_EQ(loaded.config.family, GetParam());
  const auto want = st::read_file((kHfDir / "hf_logits.safetensors").string())
                        .at(GetParam() + ".logits")
                        .to_f32();
  EXPECT_LT(relative_to_max_error(loaded.logits(fixture_tokens()), want), 1e-5);
}

TEST_P(HfInterchange, ExportThenImportIsBitwiseAndConfigReadsBack) {
  const std::string dir = (kHfDir / GetParam()).string();
  HfLoadedModel loaded(dir, 16);
  // A step-0 checkpoint of the imported weights, exported as fp32 and read back.
  CheckpointInfo info{0, 0, loaded.config, "byte", "ddp", 1, {{"options", {{"init_from", dir}}}}};
  const std::string ckpt_dir =
      save_checkpoint((work_ / "run").string(), loaded.layout, *loaded.strategy, info, 0, loaded.comm);
  const fs::path out = work_ / "export";
  export_hugging_face(CheckpointReader(ckpt_dir), export_options(out.string(), DType::fp32, 5'000'000'000));
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_TRUE(fs::exists(out / "generation_config.json"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_EQ(read_hf_model_config(out.string()), loaded.config);
  const auto hf = nlohmann::json::parse(std::ifstream(out / "config.json"));
  const auto source = nlohmann::json::parse(std::ifstream(fs::path(dir) / "config.json"));
  EXPECT_EQ(hf.value("bos_token_id", nlohmann::json()), source.value("bos_token_id", nlohmann::json()));
  HfLoadedModel again(out.string(), 16);
  for (int u = 0; u < loaded.layout.num_units(); ++u) EXPECT_EQ(loaded.master(u), again.master(u));
  // No temporary files are left behind, and a second export into the same place is
  // refused without touching what is there.
  for (const auto& entry : fs::directory_iterator(out))
    EXPECT_EQ(entry.path().filename().string().find(".export-tmp"), std::string::npos);
  const auto before = fs::last_write_time(out / "model.safetensors");
  EXPECT_THROW(export_hugging_face(CheckpointReader(ckpt_dir), export_options(out.string(), DType::fp32, 5'000'000'000)),
               Error);
  EXPECT_EQ(fs::last_write_time(out / "model.safetensors"), before);

  // Sharded and bf16: tensors split over several files with an index, values rounded.
  const fs::path sharded = work_ / "sharded";
  export_hugging_face(CheckpointReader(ckpt_dir), export_options(sharded.string(), DType::bf16, 8192));  // the largest tensor: 8192 bytes
  EXPECT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
  HfLoadedModel rounded(sharded.string(), 16);
  for (int u = 0; u < loaded.layout.num_units(); ++u) {
    const auto a = loaded.master(u), b = rounded.master(u);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(round_to(DType::bf16, a[i]), b[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfInterchange, ::testing::Values("llama", "qwen2", "qwen3"),
                         [](const auto& info) { return info.param; });

// Bad input: one clear error each, naming what was wrong.
class HfBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = fs::temp_directory_path() / ("shardlm-hf-bad-" + std::to_string(::getpid()));
    fs::remove_all(work_);
    fs::create_directories(work_);
    fs::copy(kHfDir / "qwen3", work_ / "qwen3", fs::copy_options::recursive);
    dir_ = (work_ / "qwen3").string();
    config_ = nlohmann::json::parse(std::ifstream(work_ / "qwen3" / "config.json"));
  }
  void TearDown() override { fs::remove_all(work_); }
  void write_config(const nlohmann::json& j) {
    std::ofstream(work_ / "qwen3" / "config.json") << j.dump(2);
  }
  // The error message of loading the directory (config, then weights).
  std::string error_of_loading() {
    try {
      HfLoadedModel loaded(dir_, 8);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path work_;
  std::string dir_;
  nlohmann::json config_;
};

TEST_F(HfBadInput, ConfigFieldsAreHonouredOrRefusedByName) {
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* expect;
  };
  const Case cases[] = {
      {"model_type", "mistral", "model_type 'mistral' is not supported"},
      {"hidden_act", "gelu", "hidden_act"},
      {"use_sliding_window", true, "use_sliding_window"},
      {"attention_dropout", 0.1, "dropout"},
      {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}}, "yarn"},
      {"layer_types", {"sliding_attention"}, "sliding_attention"},
      {"some_new_switch", true, "some_new_switch"},
      {"quantization_config", {{"quant_method", "gptq"}}, "quantization_config"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = config_;
    j[c.field] = c.value;
    write_config(j);
    const std::string message = error_of_loading();
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.field << ": " << message;
    EXPECT_NE(message.find("config.json"), std::string::npos) << message;
  }
  nlohmann::json j = config_;
  j.erase("hidden_size");
  write_config(j);
  EXPECT_NE(error_of_loading().find("hidden_size"), std::string::npos);
}

TEST_F(HfBadInput, TensorsMustBeExactlyTheModels) {
  const fs::path weights = work_ / "qwen3" / "model.safetensors";
  st::File original = st::read_file(weights.string());
  auto rewrite = [&](const std::function<void(std::map<std::string, st::Tensor>&)>& change) {
    auto tensors = original.tensors;
    change(tensors);
    std::vector<st::TensorView> views;
    for (const auto& [name, t] : tensors) views.push_back({name, t.dtype, t.shape, t.data.data()});
    st::write_file(weights.string(), views);
  };
  rewrite([](auto& t) { t.erase("model.layers.0.self_attn.k_norm.weight"); });
  EXPECT_NE(error_of_loading().find("has no tensor 'model.layers.0.self_attn.k_norm.weight'"),
            std::string::npos);
  rewrite([](auto& t) { t["model.layers.0.self_attn.q_proj.bias"] = t.at("model.norm.weight"); });
  EXPECT_NE(error_of_loading().find("'model.layers.0.self_attn.q_proj.bias', which the model being trained (qwen3"),
            std::string::npos);
  rewrite([](auto& t) {
    auto& w = t.at("model.layers.0.mlp.up_proj.weight");
    w.shape = {w.shape[1], w.shape[0]};
  });
  EXPECT_NE(error_of_loading().find("'model.layers.0.mlp.up_proj.weight' has shape"), std::string::npos);
  rewrite([](auto& t) {
    auto& w = t.at("model.norm.weight");
    w.dtype = st::DType::I32;
  });
  EXPECT_NE(error_of_loading().find("has dtype I32"), std::string::npos);
}

}  // namespace
