#include "shardlm/model/moe/moe_config.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

void validate_moe(const ModelConfig& c, const std::string& family) {
  const MoeConfig& m = c.moe;
  SHARDLM_CHECK(m.num_experts >= 1, "{}: num_experts must be at least 1, got {}", family,
                m.num_experts);
  SHARDLM_CHECK(m.top_k >= 1 && m.top_k <= m.num_experts,
                "{}: num_experts_per_tok (top-k) must be in [1, num_experts = {}], got {}", family,
                m.num_experts, m.top_k);
  SHARDLM_CHECK(m.expert_intermediate_size > 0, "{}: the experts' intermediate size must be "
                "positive, got {}", family, m.expert_intermediate_size);
  SHARDLM_CHECK(m.decoder_sparse_step >= 1, "{}: decoder_sparse_step must be at least 1, got {}",
                family, m.decoder_sparse_step);
  for (int l : m.mlp_only_layers)
    SHARDLM_CHECK(l >= 0 && l < c.n_layer, "{}: mlp_only_layers names layer {}; the model has "
                  "layers 0..{}", family, l, c.n_layer - 1);
  SHARDLM_CHECK(m.router_aux_loss_coef >= 0, "{}: router_aux_loss_coef must be >= 0, got {}",
                family, m.router_aux_loss_coef);
  if (family == "mixtral")
    SHARDLM_CHECK(m.norm_topk_prob && m.decoder_sparse_step == 1 && m.mlp_only_layers.empty(),
                  "mixtral renormalises its top-k weights and has every layer sparse");
  if (family == "qwen2_moe")
    SHARDLM_CHECK(m.has_shared_expert(), "qwen2_moe: shared_expert_intermediate_size must be "
                  "positive (every sparse layer has a shared expert), got {}",
                  m.shared_expert_intermediate_size);
  else
    SHARDLM_CHECK(!m.has_shared_expert(), "{}: a shared expert (shared_expert_intermediate_size "
                  "{}) is qwen2_moe's; {} has none", family, m.shared_expert_intermediate_size, family);
  // The routed experts take PEFT's target_parameters names (model/llama/llama_lora.hpp).
  // gate_proj/up_proj/down_proj are qwen2_moe's nn.Linear modules of those names for
  // PEFT 0.21 (the dense layers' MLP and the sparse layers' shared expert), as shardlm
  // reads them; of qwen3_moe and mixtral PEFT converts them to the fused experts (gate
  // and up at rank 2 r, its transformers v4 layout), which shardlm does not.
  // (Names that are no target at all: the family's check, llama_family.cpp.)
  for (const auto& target : c.lora.targets)
    SHARDLM_CHECK(family == "qwen2_moe" ||
                      (target != "gate_proj" && target != "up_proj" && target != "down_proj"),
                  "--lora-targets: '{}' in a {} model: its MLP projections are only inside the "
                  "fused experts (PEFT 0.21 converts v4 names to them at rank 2 r, which shardlm "
                  "does not); target experts.gate_up_proj and experts.down_proj", target, family);
}

nlohmann::json moe_to_json(const MoeConfig& m) {
  return {{"num_experts", m.num_experts},
          {"top_k", m.top_k},
          {"expert_intermediate_size", m.expert_intermediate_size},
          {"norm_topk_prob", m.norm_topk_prob},
          {"decoder_sparse_step", m.decoder_sparse_step},
          {"mlp_only_layers", m.mlp_only_layers},
          {"router_aux_loss_coef", m.router_aux_loss_coef},
          {"output_router_logits", m.output_router_logits},
          {"shared_expert_intermediate_size", m.shared_expert_intermediate_size}};
}

MoeConfig moe_from_json(const nlohmann::json& j) {
  MoeConfig m;
  m.num_experts = j.at("num_experts").get<int>();
  m.top_k = j.at("top_k").get<int>();
  m.expert_intermediate_size = j.at("expert_intermediate_size").get<int>();
  m.norm_topk_prob = j.at("norm_topk_prob").get<bool>();
  m.decoder_sparse_step = j.at("decoder_sparse_step").get<int>();
  m.mlp_only_layers = j.at("mlp_only_layers").get<std::vector<int>>();
  m.router_aux_loss_coef = j.at("router_aux_loss_coef").get<double>();
  m.output_router_logits = j.at("output_router_logits").get<bool>();
  // Configs written before qwen2_moe have no shared expert.
  m.shared_expert_intermediate_size = j.value("shared_expert_intermediate_size", 0);
  return m;
}

namespace {

// transformers maps num_experts onto num_local_experts for both families (attribute_map):
// 5.24 saves num_local_experts, the published Qwen3-MoE configs say num_experts.
int expert_count(HfConfigFields& f, const std::string& family, int fallback) {
  const int local = f.optional_int("num_local_experts", -1);
  const int experts = f.optional_int("num_experts", -1);
  SHARDLM_CHECK(local < 0 || experts < 0 || local == experts,
                "config.json ({}): num_experts {} and num_local_experts {} disagree", family,
                experts, local);
  return local >= 0 ? local : experts >= 0 ? experts : fallback;
}

}  // namespace

MoeConfig moe_from_hf(HfConfigFields& f, const std::string& family, int intermediate_size) {
  MoeConfig m;
  // Absent fields take the defaults of transformers' config classes.
  const bool qwen2 = family == "qwen2_moe";
  m.top_k = f.optional_int("num_experts_per_tok", family == "mixtral" ? 2 : qwen2 ? 4 : 8);
  m.output_router_logits = f.optional_bool("output_router_logits", false);
  m.router_aux_loss_coef = f.optional_number("router_aux_loss_coef", 0.001);
  if (family == "mixtral") {
    m.num_experts = expert_count(f, family, 8);
    m.expert_intermediate_size = intermediate_size;
    m.norm_topk_prob = true;
    // Multiplicative noise on the router's input while training: not computed.
    f.expect_number("router_jitter_noise", 0.0);
    return m;
  }
  m.num_experts = expert_count(f, family, qwen2 ? 60 : 128);
  m.expert_intermediate_size = f.optional_int("moe_intermediate_size", qwen2 ? 1408 : 768);
  if (qwen2) m.shared_expert_intermediate_size = f.optional_int("shared_expert_intermediate_size", 5632);
  m.norm_topk_prob = f.optional_bool("norm_topk_prob", false);
  m.decoder_sparse_step = f.optional_int("decoder_sparse_step", 1);
  const nlohmann::json& only = f.optional("mlp_only_layers");
  if (!only.is_null()) {
    SHARDLM_CHECK(only.is_array(), "config.json ({}): mlp_only_layers must be a list of layer "
                  "indices, got {}", family, only.dump());
    for (const auto& l : only) {
      SHARDLM_CHECK(l.is_number_integer(), "config.json ({}): mlp_only_layers must be a list of "
                    "layer indices, got {}", family, only.dump());
      m.mlp_only_layers.push_back(l.get<int>());
    }
  }
  return m;
}

void moe_to_hf(const ModelConfig& c, nlohmann::json& j) {
  const MoeConfig& m = c.moe;
  j["num_experts_per_tok"] = m.top_k;
  j["output_router_logits"] = m.output_router_logits;
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  if (c.family == "mixtral") {
    j["num_local_experts"] = m.num_experts;
    j["router_jitter_noise"] = 0.0;
    return;
  }
  j["num_experts"] = m.num_experts;
  j["moe_intermediate_size"] = m.expert_intermediate_size;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["decoder_sparse_step"] = m.decoder_sparse_step;
  j["mlp_only_layers"] = m.mlp_only_layers;
  if (m.has_shared_expert()) j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
}

}  // namespace shardlm
