#include "shardlm/model/llama/llama_lora.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/model/llama/llama_family.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

const std::vector<std::string>& llama_lora_modules() {
  static const std::vector<std::string> modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
  return modules;
}

const std::vector<std::string>& moe_expert_lora_modules() {
  static const std::vector<std::string> modules = {"experts.gate_up_proj", "experts.down_proj"};
  return modules;
}

bool llama_expert_lora(const ModelConfig& c) {
  if (!c.lora.enabled() || !c.moe.enabled()) return false;
  for (const auto& m : moe_expert_lora_modules())
    if (c.lora.targets_module(m)) return true;
  return false;
}

bool llama_layer_adapters(const ModelConfig& c) {
  if (!c.lora.enabled()) return false;
  bool attention = false, mlp = false;
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) attention = attention || c.lora.targets_module(m);
  for (const char* m : {"gate_proj", "up_proj", "down_proj"}) mlp = mlp || c.lora.targets_module(m);
  // The MLP modules exist in a dense layer and in a sparse layer's shared expert (llama_lora_groups).
  const bool dense_layer = c.moe.sparse_layers(c.n_layer) < c.n_layer;
  return attention || (mlp && (dense_layer || c.moe.has_shared_expert()));
}

std::vector<LoraGroup> llama_lora_groups(const ModelConfig& c, int tensor_size, int layer) {
  const int64_t C = c.n_embd, hd = c.head_dim(), Q = c.n_head / tensor_size * hd;
  const int64_t KV = tensor_local_kv_heads(c, tensor_size) * hd;
  std::vector<LoraGroup> all = {
      {LoraGroup::Input::ln1, C, Q + 2 * KV,
       {{"q_proj", "self_attn", Q, 0}, {"k_proj", "self_attn", KV, Q}, {"v_proj", "self_attn", KV, Q + KV}}},
      {LoraGroup::Input::attention, Q, C, {{"o_proj", "self_attn", C, 0}}},
  };
  const bool sparse = c.moe.enabled() && c.moe.sparse_layer(layer);
  if (!sparse || c.moe.has_shared_expert()) {
    const int64_t I = (sparse ? c.moe.shared_expert_intermediate_size : c.mlp_width()) / tensor_size;
    const std::string mlp = sparse ? "mlp.shared_expert" : "mlp";
    all.push_back({LoraGroup::Input::ln2, C, 2 * I, {{"gate_proj", mlp, I, 0}, {"up_proj", mlp, I, I}}});
    all.push_back({LoraGroup::Input::act, I, C, {{"down_proj", mlp, C, 0}}});
  }
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

namespace {

// Model units per expert: itself, and its adapters when LoRA adapts the experts.
int units_per_expert(const ModelConfig& c) { return llama_expert_lora(c) ? 2 : 1; }

// Model units of layer l: its adapters (LoRA), itself, its experts (sparse layers).
int units_of_layer(const ModelConfig& c, int layer) {
  return (llama_layer_adapters(c) ? 1 : 0) + 1 +
         (c.moe.sparse_layer(layer) ? c.moe.num_experts * units_per_expert(c) : 0);
}

int first_unit_of_layer(const ModelConfig& c, int layer) {
  if (!c.moe.enabled()) return 1 + layer * units_of_layer(c, 0);
  int u = 1;
  for (int l = 0; l < layer; ++l) u += units_of_layer(c, l);
  return u;
}

}  // namespace

int llama_num_units(const ModelConfig& c) { return first_unit_of_layer(c, c.n_layer) + 1; }

int llama_adapter_unit(const ModelConfig& c, int layer) {
  return llama_layer_adapters(c) ? first_unit_of_layer(c, layer) : -1;
}

int llama_layer_unit(const ModelConfig& c, int layer) {
  return first_unit_of_layer(c, layer) + (llama_layer_adapters(c) ? 1 : 0);
}

int llama_expert_unit(const ModelConfig& c, int layer, int expert) {
  SHARDLM_CHECK(c.moe.sparse_layer(layer) && expert >= 0 && expert < c.moe.num_experts,
                "model: layer {} has no expert {}", layer, expert);
  return llama_layer_unit(c, layer) + 1 + (llama_expert_lora(c) ? c.moe.num_experts : 0) + expert;
}

int llama_expert_adapter_unit(const ModelConfig& c, int layer, int expert) {
  SHARDLM_CHECK(llama_expert_lora(c), "model: the experts of layer {} have no adapters", layer);
  SHARDLM_CHECK(c.moe.sparse_layer(layer) && expert >= 0 && expert < c.moe.num_experts,
                "model: layer {} has no expert {}", layer, expert);
  return llama_layer_unit(c, layer) + 1 + expert;
}

std::vector<LlamaUnitRole> llama_unit_roles(const ModelConfig& c) {
  std::vector<LlamaUnitRole> roles = {{LlamaUnitRole::Kind::embeddings, -1}};
  for (int l = 0; l < c.n_layer; ++l) {
    if (llama_layer_adapters(c)) roles.push_back({LlamaUnitRole::Kind::adapters, l});
    roles.push_back({LlamaUnitRole::Kind::layer, l});
    if (c.moe.sparse_layer(l) && llama_expert_lora(c))
      for (int e = 0; e < c.moe.num_experts; ++e) roles.push_back({LlamaUnitRole::Kind::expert_adapters, l, e});
    if (c.moe.sparse_layer(l))
      for (int e = 0; e < c.moe.num_experts; ++e) roles.push_back({LlamaUnitRole::Kind::expert, l, e});
  }
  roles.push_back({LlamaUnitRole::Kind::final, -1});
  return roles;
}

LlamaUnitRole llama_unit_role(const ModelConfig& c, int unit) {
  const int n = llama_num_units(c);
  SHARDLM_CHECK(unit >= 0 && unit < n, "model: unit {} out of range [0, {})", unit, n);
  if (unit == 0) return {LlamaUnitRole::Kind::embeddings, -1};
  if (unit == n - 1) return {LlamaUnitRole::Kind::final, -1};
  if (!c.moe.enabled()) {
    if (!llama_layer_adapters(c)) return {LlamaUnitRole::Kind::layer, unit - 1};
    return {unit % 2 == 1 ? LlamaUnitRole::Kind::adapters : LlamaUnitRole::Kind::layer, (unit - 1) / 2};
  }
  return llama_unit_roles(c)[static_cast<size_t>(unit)];
}

}  // namespace shardlm
