#include "shardlm/model/config.hpp"

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"

namespace shardlm {

void ModelConfig::validate() const {
  const ModelFamily& f = model_family(family);  // throws for an unknown family
  SHARDLM_CHECK(n_layer > 0, "n_layer must be positive, got {}", n_layer);
  SHARDLM_CHECK(n_head > 0, "n_head must be positive, got {}", n_head);
  SHARDLM_CHECK(n_embd > 0, "n_embd must be positive, got {}", n_embd);
  SHARDLM_CHECK(vocab_size > 0, "vocab_size must be positive, got {}", vocab_size);
  SHARDLM_CHECK(max_seq_len > 0, "max_seq_len must be positive, got {}", max_seq_len);
  SHARDLM_CHECK(init_std > 0.0f, "init_std must be positive, got {}", init_std);
  f.validate(*this);
}

int64_t ModelConfig::num_parameters() const {
  int64_t total = 0;
  for (const auto& unit : model_family(family).model_units(*this))
    for (const auto& p : unit.params)
      total += p.valid_rows < 0 ? p.numel : p.valid_rows * (p.numel / p.shape[0]);
  return total;
}

double ModelConfig::train_flops_per_token(int seq_len) const {
  return model_family(family).train_flops_per_token(*this, seq_len);
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = model_family(family).to_json(*this);
  j["family"] = family;
  return j;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  ModelConfig c;
  try {
    c.family = j.at("family").get<std::string>();
    model_family(c.family).from_json(j, c);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("model config: {}", e.what()));
  }
  c.validate();
  return c;
}

namespace {

ModelConfig make_gpt2(int n_layer, int n_head, int n_embd, int max_seq_len) {
  ModelConfig c;
  c.family = "gpt2";
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.vocab_size = 50257;
  c.max_seq_len = max_seq_len;
  return c;
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};

// Shapes checked against the published config.json of each model (HF hub:
// HuggingFaceTB/SmolLM2-135M, Qwen/Qwen2.5-0.5B, Qwen/Qwen3-0.6B,
// meta-llama/Llama-3.2-1B, Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B,
// meta-llama/Llama-3.1-70B). The tiny ones are for tests: odd sizes on purpose.
const Preset kPresets[] = {
    {"gpt2-tiny", [] { return make_gpt2(4, 4, 128, 256); }},
    {"gpt2-small-30m", [] { return make_gpt2(6, 6, 384, 1024); }},
    {"gpt2", [] { return make_gpt2(12, 12, 768, 1024); }},
    {"gpt2-medium", [] { return make_gpt2(24, 16, 1024, 1024); }},
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

ModelConfig model_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return p.make();
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown model preset '{}' (expected one of: {})", name, known));
}

}  // namespace shardlm
