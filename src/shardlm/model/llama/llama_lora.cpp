#include "shardlm/model/llama/llama_lora.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/model/llama/llama_family.hpp"

namespace shardlm {

const std::vector<std::string>& llama_lora_modules() {
  static const std::vector<std::string> modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
  return modules;
}

std::vector<LoraGroup> llama_lora_groups(const ModelConfig& c) {
  const int64_t C = c.n_embd, hd = c.head_dim(), Q = c.n_head * hd, KV = c.kv_heads() * hd;
  const int64_t I = c.mlp_width();
  std::vector<LoraGroup> all = {
      {LoraGroup::Input::ln1, C, Q + 2 * KV,
       {{"q_proj", "self_attn", Q, 0}, {"k_proj", "self_attn", KV, Q}, {"v_proj", "self_attn", KV, Q + KV}}},
      {LoraGroup::Input::attention, Q, C, {{"o_proj", "self_attn", C, 0}}},
      {LoraGroup::Input::ln2, C, 2 * I, {{"gate_proj", "mlp", I, 0}, {"up_proj", "mlp", I, I}}},
      {LoraGroup::Input::act, I, C, {{"down_proj", "mlp", C, 0}}},
  };
  std::vector<LoraGroup> groups;
  for (LoraGroup g : all) {
    std::vector<LoraTarget> kept;
    for (const auto& t : g.targets)
      if (c.lora.targets_module(t.module)) kept.push_back(t);
    g.targets = kept;
    if (!g.targets.empty()) groups.push_back(g);
  }
  return groups;
}

std::string lora_a_name(int layer, const LoraTarget& t) {
  return llama_param_name(layer, t.parent + "." + t.module + ".lora_A.weight");
}

std::string lora_b_name(int layer, const LoraTarget& t) {
  return llama_param_name(layer, t.parent + "." + t.module + ".lora_B.weight");
}

int llama_num_units(const ModelConfig& c) {
  return c.lora.enabled() ? 2 * c.n_layer + 2 : c.n_layer + 2;
}

int llama_adapter_unit(const ModelConfig& c, int layer) {
  return c.lora.enabled() ? 2 * layer + 1 : -1;
}

int llama_layer_unit(const ModelConfig& c, int layer) {
  return c.lora.enabled() ? 2 * layer + 2 : layer + 1;
}

LlamaUnitRole llama_unit_role(const ModelConfig& c, int unit) {
  const int n = llama_num_units(c);
  SHARDLM_CHECK(unit >= 0 && unit < n, "model: unit {} out of range [0, {})", unit, n);
  if (unit == 0) return {LlamaUnitRole::Kind::embeddings, -1};
  if (unit == n - 1) return {LlamaUnitRole::Kind::final, -1};
  if (!c.lora.enabled()) return {LlamaUnitRole::Kind::layer, unit - 1};
  return {unit % 2 == 1 ? LlamaUnitRole::Kind::adapters : LlamaUnitRole::Kind::layer, (unit - 1) / 2};
}

}  // namespace shardlm
