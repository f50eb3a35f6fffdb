#include "shardlm/model/llama/llama_family.hpp"

#include <cmath>

#include "shardlm/core/error.hpp"
#include "shardlm/model/hf_config_fields.hpp"
#include "shardlm/model/llama/llama_lora.hpp"
#include "shardlm/model/llama/llama_model.hpp"
#include "shardlm/model/moe/moe_config.hpp"
#include "shardlm/model/moe/moe_expert_lora.hpp"
#include "shardlm/model/moe/moe_names.hpp"

namespace shardlm {

std::string llama_param_name(int layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

namespace {

const char* variant_name(LlamaVariant v) {
  switch (v) {
    case LlamaVariant::llama: return "llama";
    case LlamaVariant::qwen2: return "qwen2";
    case LlamaVariant::qwen3: return "qwen3";
    case LlamaVariant::qwen3_moe: return "qwen3_moe";
    case LlamaVariant::qwen2_moe: return "qwen2_moe";
    case LlamaVariant::mixtral: return "mixtral";
  }
  return "?";
}

const char* architecture(LlamaVariant v) {
  switch (v) {
    case LlamaVariant::llama: return "LlamaForCausalLM";
    case LlamaVariant::qwen2: return "Qwen2ForCausalLM";
    case LlamaVariant::qwen3: return "Qwen3ForCausalLM";
    case LlamaVariant::qwen3_moe: return "Qwen3MoeForCausalLM";
    case LlamaVariant::qwen2_moe: return "Qwen2MoeForCausalLM";
    case LlamaVariant::mixtral: return "MixtralForCausalLM";
  }
  return "?";
}

bool is_moe(LlamaVariant v) {
  return v == LlamaVariant::qwen3_moe || v == LlamaVariant::qwen2_moe || v == LlamaVariant::mixtral;
}

class LlamaFamily final : public ModelFamily {
 public:
  explicit LlamaFamily(LlamaVariant variant) : variant_(variant), name_(variant_name(variant)) {}

  void validate(const ModelConfig& c) const override {
    SHARDLM_CHECK(c.kv_heads() > 0 && c.n_head % c.kv_heads() == 0,
                  "{}: n_head ({}) must be a multiple of n_kv_head ({})", name_, c.n_head,
                  c.kv_heads());
    SHARDLM_CHECK(c.head_dim() > 0 && c.head_dim() % 2 == 0,
                  "{}: head_dim must be positive and even (rotary pairs), got {}", name_,
                  c.head_dim());
    SHARDLM_CHECK(c.head_dim_override > 0 || c.n_embd % c.n_head == 0,
                  "{}: n_embd ({}) must be divisible by n_head ({}) unless head_dim is given",
                  name_, c.n_embd, c.n_head);
    SHARDLM_CHECK(c.mlp_width() > 0, "{}: intermediate_size must be positive", name_);
    SHARDLM_CHECK(c.rope_theta > 0, "{}: rope_theta must be positive, got {}", name_, c.rope_theta);
    SHARDLM_CHECK(c.norm_eps > 0, "{}: norm_eps must be positive, got {}", name_, c.norm_eps);
    const RopeScaling& s = c.rope_scaling;
    SHARDLM_CHECK(s.type == "default" || s.type == "llama3",
                  "{}: rope_scaling type '{}' is not supported (expected default or llama3)", name_,
                  s.type);
    if (s.type == "llama3")
      SHARDLM_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                        s.original_max_position_embeddings > 0,
                    "{}: llama3 rope_scaling needs factor > 0, 0 < low_freq_factor < "
                    "high_freq_factor and original_max_position_embeddings > 0",
                    name_);
    if (is_moe(variant_)) {
      validate_moe(c, name_);
    } else {
      SHARDLM_CHECK(!c.moe.enabled(), "{} is a dense family: experts are qwen3_moe's, qwen2_moe's and mixtral's",
                    name_);
    }
    std::vector<std::string> modules = llama_lora_modules();
    if (is_moe(variant_))
      modules.insert(modules.end(), moe_expert_lora_modules().begin(), moe_expert_lora_modules().end());
    for (const auto& target : c.lora.targets) {
      bool known = false;
      for (const auto& m : modules) known = known || m == target;
      std::string list;
      for (const auto& m : modules) list += (list.empty() ? "" : ", ") + m;
      SHARDLM_CHECK(known, "--lora-targets: '{}' is not a linear layer of a {} model (expected "
                    "all-linear or some of: {})", target, name_, list);
    }
    switch (variant_) {
      case LlamaVariant::llama:
        SHARDLM_CHECK(!c.qk_norm && c.qkv_bias == c.o_bias,
                      "llama: q/k norms are qwen3's; llama's attention_bias sets q/k/v and o "
                      "biases together");
        break;
      case LlamaVariant::qwen2:
        SHARDLM_CHECK(c.qkv_bias && !c.o_bias && !c.qk_norm,
                      "qwen2 has q/k/v biases, no o_proj bias and no q/k norms");
        break;
      case LlamaVariant::qwen3:
      case LlamaVariant::qwen3_moe:
        SHARDLM_CHECK(c.qk_norm && c.qkv_bias == c.o_bias,
                      "{} has q/k norms; its attention_bias sets q/k/v and o biases together", name_);
        break;
      case LlamaVariant::qwen2_moe:
        SHARDLM_CHECK(!c.o_bias && !c.qk_norm,
                      "qwen2_moe has no o_proj bias and no q/k norms (its q/k/v biases follow qkv_bias)");
        break;
      case LlamaVariant::mixtral:
        SHARDLM_CHECK(!c.qk_norm && !c.qkv_bias && !c.o_bias,
                      "mixtral has no q/k norms and no attention biases");
        break;
    }
  }

  nlohmann::json to_json(const ModelConfig& c) const override {
    nlohmann::json j = {{"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_kv_head", c.kv_heads()},
            {"n_embd", c.n_embd},
            {"head_dim", c.head_dim()},
            {"intermediate_size", c.mlp_width()},
            {"vocab_size", c.vocab_size},
            {"max_seq_len", c.max_seq_len},
            {"init_std", c.init_std},
            {"tie_embeddings", c.tie_embeddings},
            {"rope_theta", c.rope_theta},
            {"rope_scaling",
             {{"type", c.rope_scaling.type},
              {"factor", c.rope_scaling.factor},
              {"low_freq_factor", c.rope_scaling.low_freq_factor},
              {"high_freq_factor", c.rope_scaling.high_freq_factor},
              {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}}},
            {"norm_eps", c.norm_eps},
            {"qkv_bias", c.qkv_bias},
            {"o_bias", c.o_bias},
            {"qk_norm", c.qk_norm}};
    if (c.moe.enabled()) j["moe"] = moe_to_json(c.moe);
    return j;
  }

  void from_json(const nlohmann::json& j, ModelConfig& c) const override {
    c.n_layer = j.at("n_layer").get<int>();
    c.n_head = j.at("n_head").get<int>();
    c.n_kv_head = j.at("n_kv_head").get<int>();
    c.n_embd = j.at("n_embd").get<int>();
    c.head_dim_override = j.at("head_dim").get<int>();
    c.intermediate_size = j.at("intermediate_size").get<int>();
    c.vocab_size = j.at("vocab_size").get<int>();
    c.max_seq_len = j.at("max_seq_len").get<int>();
    c.init_std = j.at("init_std").get<float>();
    c.tie_embeddings = j.at("tie_embeddings").get<bool>();
    c.rope_theta = j.at("rope_theta").get<double>();
    const auto& s = j.at("rope_scaling");
    c.rope_scaling.type = s.at("type").get<std::string>();
    c.rope_scaling.factor = s.value("factor", 1.0);
    c.rope_scaling.low_freq_factor = s.value("low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = s.value("high_freq_factor", 4.0);
    c.rope_scaling.original_max_position_embeddings =
        s.value("original_max_position_embeddings", 8192);
    c.norm_eps = j.at("norm_eps").get<float>();
    c.qkv_bias = j.at("qkv_bias").get<bool>();
    c.o_bias = j.at("o_bias").get<bool>();
    c.qk_norm = j.at("qk_norm").get<bool>();
    if (j.contains("moe")) c.moe = moe_from_json(j.at("moe"));
  }

  std::vector<UnitLayout> model_units(const ModelConfig& c) const override {
    const int64_t C = c.n_embd, hd = c.head_dim(), Q = c.n_head * hd, KV = c.kv_heads() * hd;
    const int64_t I = c.mlp_width(), V = c.padded_vocab_size();
    const float std = c.init_std;
    const bool base_trains = !c.lora.enabled();
    std::vector<UnitLayout> units;
    UnitBuilder embeddings("embeddings", base_trains);
    embeddings.add("model.embed_tokens.weight", {V, C}, ParamInit::normal, std).valid_rows = c.vocab_size;
    units.push_back(embeddings.finish());
    for (int l = 0; l < c.n_layer; ++l) {
      if (llama_layer_adapters(c)) units.push_back(adapter_unit(c, l));
      UnitBuilder b("layers." + std::to_string(l), base_trains);
      auto name = [&](const char* suffix) { return llama_param_name(l, suffix); };
      b.add(name("input_layernorm.weight"), {C}, ParamInit::ones);
      // The linear weights; QLoRA stores each as its own NF4 tensor (the model
      // dequantizes them back to back, so q|k|v and gate|up still read as one matrix).
      const bool nf4 = c.quantize_base == BaseQuant::nf4;
      auto linear = [&](const char* suffix, std::vector<int64_t> shape, bool pack) {
        if (nf4) {
          b.add_nf4(name(suffix), std::move(shape), ParamInit::normal, std);
        } else {
          b.add(name(suffix), std::move(shape), ParamInit::normal, std, pack);
        }
      };
      // q, k, v back to back: one [Q + 2 KV, C] matrix (and one bias vector).
      linear("self_attn.q_proj.weight", {Q, C}, false);
      linear("self_attn.k_proj.weight", {KV, C}, /*pack=*/true);
      linear("self_attn.v_proj.weight", {KV, C}, true);
      if (c.qkv_bias) {
        b.add(name("self_attn.q_proj.bias"), {Q}, ParamInit::zeros);
        b.add(name("self_attn.k_proj.bias"), {KV}, ParamInit::zeros, 0.0f, true);
        b.add(name("self_attn.v_proj.bias"), {KV}, ParamInit::zeros, 0.0f, true);
      }
      if (c.qk_norm) {
        b.add(name("self_attn.q_norm.weight"), {hd}, ParamInit::ones);
        b.add(name("self_attn.k_norm.weight"), {hd}, ParamInit::ones);
      }
      linear("self_attn.o_proj.weight", {C, Q}, false);
      if (c.o_bias) b.add(name("self_attn.o_proj.bias"), {C}, ParamInit::zeros);
      b.add(name("post_attention_layernorm.weight"), {C}, ParamInit::ones);
      if (c.moe.sparse_layer(l)) {
        // The router here (QLoRA keeps it, and the shared expert's gate, in fp32: the
        // routing's choices are what a small error would change); each expert is a unit
        // of its own, after the layer.
        const MoeNames& moe = moe_names(c);
        b.add(name(moe.router_suffix().c_str()), {c.moe.num_experts, C}, ParamInit::normal, std);
        if (c.moe.has_shared_expert()) {
          // qwen2_moe's shared expert (every token) and its gate: dense, in the layer's unit.
          const int64_t Is = c.moe.shared_expert_intermediate_size;
          linear("mlp.shared_expert.gate_proj.weight", {Is, C}, false);
          linear("mlp.shared_expert.up_proj.weight", {Is, C}, /*pack=*/true);
          linear("mlp.shared_expert.down_proj.weight", {C, Is}, false);
          b.add(name("mlp.shared_expert_gate.weight"), {1, C}, ParamInit::normal, std);
        }
        units.push_back(b.finish());
        const int64_t Ie = c.moe.expert_intermediate_size;
        if (llama_expert_lora(c))
          for (int e = 0; e < c.moe.num_experts; ++e) units.push_back(expert_adapter_unit(c, l, e));
        for (int e = 0; e < c.moe.num_experts; ++e) {
          UnitBuilder expert("layers." + std::to_string(l) + ".experts." + std::to_string(e), base_trains);
          const MoeNames::Expert n = moe.expert(l, e);
          if (nf4) {  // QLoRA: three NF4 tensors, dequantized back to back
            expert.add_nf4(n.gate, {Ie, C}, ParamInit::normal, std);
            expert.add_nf4(n.up, {Ie, C}, ParamInit::normal, std);
            expert.add_nf4(n.down, {C, Ie}, ParamInit::normal, std);
          } else {
            expert.add(n.gate, {Ie, C}, ParamInit::normal, std);
            expert.add(n.up, {Ie, C}, ParamInit::normal, std, /*pack_with_previous=*/true);
            expert.add(n.down, {C, Ie}, ParamInit::normal, std);
          }
          UnitLayout u = expert.finish();
          u.token_fraction = static_cast<double>(c.moe.top_k) / c.moe.num_experts;
          u.expert = e;
          u.experts = c.moe.num_experts;
          units.push_back(std::move(u));
        }
        continue;
      }
      // gate and up back to back: one [2 I, C] matrix.
      linear("mlp.gate_proj.weight", {I, C}, false);
      linear("mlp.up_proj.weight", {I, C}, true);
      linear("mlp.down_proj.weight", {C, I}, false);
      units.push_back(b.finish());
    }
    UnitBuilder final_unit("final", base_trains);
    final_unit.add("model.norm.weight", {C}, ParamInit::ones);
    if (!c.tie_embeddings)
      final_unit.add("lm_head.weight", {V, C}, ParamInit::normal, std).valid_rows = c.vocab_size;
    units.push_back(final_unit.finish());
    return units;
  }

  std::vector<std::vector<int>> unit_needs(const ModelConfig& c) const override {
    std::vector<std::vector<int>> needs;
    const std::vector<LlamaUnitRole> roles = llama_unit_roles(c);
    for (int u = 0; u < static_cast<int>(roles.size()); ++u) {
      const LlamaUnitRole& role = roles[static_cast<size_t>(u)];
      if (role.kind == LlamaUnitRole::Kind::final && c.tie_embeddings) {
        needs.push_back({0, u});
      } else if (role.kind == LlamaUnitRole::Kind::layer && llama_layer_adapters(c)) {
        needs.push_back({llama_adapter_unit(c, role.layer), u});
      } else if (role.kind == LlamaUnitRole::Kind::expert && llama_expert_lora(c)) {
        needs.push_back({llama_expert_adapter_unit(c, role.layer, role.expert), u});
      } else {
        needs.push_back({u});
      }
    }
    return needs;
  }

  double train_flops_per_token(const ModelConfig& c, int seq_len) const override {
    // 6 flops per matmul weight per token (forward 2, backward 4), LM head included;
    // causal attention: scores and values, 2 * 2 * T * (H hd) per layer forward,
    // halved by causality, times 3 with the backward.
    const double C = c.n_embd, Q = static_cast<double>(c.n_head) * c.head_dim();
    const double KV = static_cast<double>(c.kv_heads()) * c.head_dim(), I = c.mlp_width();
    // A sparse layer multiplies each token by its router and top_k experts.
    const int sparse = c.moe.sparse_layers(c.n_layer);
    const double attention_params = C * (Q + 2 * KV) + Q * C;
    const double sparse_mlp = C * c.moe.num_experts + c.moe.top_k * 3.0 * C * c.moe.expert_intermediate_size +
                              3.0 * C * c.moe.shared_expert_intermediate_size + (c.moe.has_shared_expert() ? C : 0);
    const double matmul_params = (c.n_layer - sparse) * (attention_params + 3.0 * C * I) +
                                 sparse * (attention_params + sparse_mlp) +
                                 static_cast<double>(c.padded_vocab_size()) * C;
    const double attention = c.n_layer * 6.0 * seq_len * Q;
    if (!c.lora.enabled()) return 6.0 * matmul_params + attention;
    // LoRA: the frozen base runs forward (2) and backward-data (2), no weight gradient;
    // each adapter pair A, B trains in full (6 per parameter).
    double adapter_params = 0;  // over the layers
    for (int l = 0; l < c.n_layer; ++l)
      for (const auto& g : llama_lora_groups(c, 1, l))
        for (const auto& t : g.targets) adapter_params += c.lora.rank * static_cast<double>(g.in + t.out);
    // The experts' adapters see the top_k experts' tokens: top_k pairs per token.
    double expert_adapter_params = 0;
    const double Ie = c.moe.expert_intermediate_size;
    if (c.lora.targets_module("experts.gate_up_proj")) expert_adapter_params += c.lora.rank * (C + 2 * Ie);
    if (c.lora.targets_module("experts.down_proj")) expert_adapter_params += c.lora.rank * (Ie + C);
    return 4.0 * matmul_params + 6.0 * adapter_params +
           6.0 * sparse * c.moe.top_k * expert_adapter_params + attention;
  }

  std::unique_ptr<Model> make_model(const ModelConfig& config, const ParamLayout& layout,
                                    int max_batch, int max_seq, const ModelOptions& options,
                                    MemoryTracker& tracker) const override {
    return std::make_unique<LlamaModel>(config, layout, max_batch, max_seq, options, tracker);
  }

  ModelMemoryPlan plan_memory(const ModelConfig& config, int max_batch, int max_seq,
                              const ModelOptions& options,
                              bool params_in_compute_type) const override {
    return LlamaModel::plan_memory(config, max_batch, max_seq, options, params_in_compute_type);
  }

  ModelConfig config_from_hf(const nlohmann::json& hf) const override {
    HfConfigFields f(hf, name_);
    ModelConfig c;
    c.family = name_;
    c.n_layer = f.require_int("num_hidden_layers");
    c.n_embd = f.require_int("hidden_size");
    c.intermediate_size = f.require_int("intermediate_size");
    c.n_head = f.require_int("num_attention_heads");
    c.n_kv_head = f.optional_int("num_key_value_heads", c.n_head);
    // Qwen3Config's head_dim defaults to 128 whatever the width; the others derive it.
    const int derived_head_dim = variant_ == LlamaVariant::qwen3 ? 128 : c.n_embd / c.n_head;
    c.head_dim_override = f.optional_int("head_dim", derived_head_dim);
    c.vocab_size = f.require_int("vocab_size");
    const int default_context = variant_ == LlamaVariant::llama     ? 2048
                                : variant_ == LlamaVariant::mixtral ? 131072
                                                                    : 32768;
    c.max_seq_len = f.optional_int("max_position_embeddings", default_context);
    c.norm_eps = static_cast<float>(
        f.optional_number("rms_norm_eps", variant_ == LlamaVariant::mixtral ? 1e-5 : 1e-6));
    c.tie_embeddings = f.optional_bool("tie_word_embeddings", false);
    c.init_std = static_cast<float>(f.optional_number("initializer_range", 0.02));
    f.expect_string("hidden_act", {"silu"});
    f.expect_no_dropout("attention_dropout");
    read_rope(f, hf, c);
    switch (variant_) {
      case LlamaVariant::llama:
        c.qkv_bias = c.o_bias = f.optional_bool("attention_bias", false);
        f.expect_bool("mlp_bias", false);
        f.expect_int_or_null("pretraining_tp", 1);
        f.expect_bool("rope_interleaved", false);  // SmolLM2's configs state it
        f.ignore({"is_llama_config"});
        break;
      case LlamaVariant::qwen2:
        c.qkv_bias = true;
        read_sliding_window(f, hf, c);
        f.expect_bool("use_mrope", false);
        break;
      case LlamaVariant::qwen2_moe:
        c.qkv_bias = f.optional_bool("qkv_bias", true);
        read_sliding_window(f, hf, c);
        break;
      case LlamaVariant::qwen3:
      case LlamaVariant::qwen3_moe:
        c.qk_norm = true;
        c.qkv_bias = c.o_bias = f.optional_bool("attention_bias", false);
        read_sliding_window(f, hf, c);
        break;
      case LlamaVariant::mixtral:
        // Mixtral's sliding window is on whenever it is set (no use_sliding_window).
        SHARDLM_CHECK(f.optional("sliding_window").is_null(), "config.json (mixtral): "
                      "sliding_window {} is not supported (only full attention: null)",
                      hf.at("sliding_window").dump());
        break;
    }
    if (is_moe(variant_)) c.moe = moe_from_hf(f, name_, c.intermediate_size);
    f.finish();
    c.validate();
    return c;
  }

  nlohmann::json hf_config(const ModelConfig& c) const override {
    nlohmann::json j = {{"architectures", {architecture(variant_)}},
                        {"model_type", name_},
                        {"vocab_size", c.vocab_size},
                        {"hidden_size", c.n_embd},
                        {"intermediate_size", c.mlp_width()},
                        {"num_hidden_layers", c.n_layer},
                        {"num_attention_heads", c.n_head},
                        {"num_key_value_heads", c.kv_heads()},
                        {"head_dim", c.head_dim()},
                        {"hidden_act", "silu"},
                        {"max_position_embeddings", c.max_seq_len},
                        {"rms_norm_eps", c.norm_eps},
                        {"initializer_range", c.init_std},
                        {"tie_word_embeddings", c.tie_embeddings},
                        {"rope_theta", c.rope_theta},
                        {"attention_dropout", 0.0},
                        {"torch_dtype", "float32"}};
    if (c.rope_scaling.type == "llama3") {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings",
                            c.rope_scaling.original_max_position_embeddings}};
    } else {
      j["rope_scaling"] = nullptr;
    }
    if (variant_ == LlamaVariant::llama) {
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = false;
      j["pretraining_tp"] = 1;
    } else {
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      if (variant_ == LlamaVariant::qwen3 || variant_ == LlamaVariant::qwen3_moe)
        j["attention_bias"] = c.qkv_bias;
      if (variant_ == LlamaVariant::qwen2_moe) j["qkv_bias"] = c.qkv_bias;
    }
    if (variant_ == LlamaVariant::mixtral) j.erase("use_sliding_window");
    if (is_moe(variant_)) moe_to_hf(c, j);
    return j;
  }

 private:
  // rope_theta + rope_scaling (transformers 4.x), or rope_parameters (5.x).
  void read_rope(HfConfigFields& f, const nlohmann::json& hf, ModelConfig& c) const {
    nlohmann::json scaling = f.optional("rope_scaling");
    const nlohmann::json& parameters = f.optional("rope_parameters");
    c.rope_theta = f.optional_number("rope_theta", 10000.0);
    if (parameters.is_object()) {
      if (parameters.contains("rope_theta")) c.rope_theta = parameters.at("rope_theta").get<double>();
      scaling = parameters;
    }
    (void)hf;
    if (!scaling.is_object()) return;
    const std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
    for (auto it = scaling.begin(); it != scaling.end(); ++it) {
      static const std::set<std::string> known = {"rope_type", "type", "rope_theta", "factor",
                                                  "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings"};
      SHARDLM_CHECK(known.count(it.key()), "config.json ({}): rope setting '{}' is not supported",
                    name_, it.key());
    }
    SHARDLM_CHECK(type == "default" || type == "llama3",
                  "config.json ({}): rope type '{}' is not supported (expected default or llama3)",
                  name_, type);
    if (type == "default") return;
    c.rope_scaling.type = type;
    c.rope_scaling.factor = scaling.at("factor").get<double>();
    c.rope_scaling.low_freq_factor = scaling.at("low_freq_factor").get<double>();
    c.rope_scaling.high_freq_factor = scaling.at("high_freq_factor").get<double>();
    c.rope_scaling.original_max_position_embeddings =
        scaling.at("original_max_position_embeddings").get<int>();
  }

  // Sliding-window attention is not computed: refused when on; its window sizes are
  // irrelevant when off. layer_types (5.x) must be all full attention.
  void read_sliding_window(HfConfigFields& f, const nlohmann::json& hf, ModelConfig& c) const {
    f.expect_bool("use_sliding_window", false);
    f.ignore({"sliding_window", "max_window_layers"});
    const auto& types = f.optional("layer_types");
    (void)hf;
    if (types.is_array()) {
      SHARDLM_CHECK(static_cast<int>(types.size()) == c.n_layer,
                    "config.json ({}): layer_types has {} entries for {} layers", name_, types.size(),
                    c.n_layer);
      for (const auto& t : types)
        SHARDLM_CHECK(t == "full_attention",
                      "config.json ({}): layer type {} is not supported (only full_attention)",
                      name_, t.dump());
    }
  }

  std::vector<LoraPair> lora_pairs(const ModelConfig& c) const override {
    std::vector<LoraPair> pairs;
    if (!c.lora.enabled()) return pairs;
    for (int l = 0; l < c.n_layer; ++l)
      for (const LoraGroup& g : llama_lora_groups(c, 1, l))
        for (const auto& tg : g.targets)
          pairs.push_back({llama_param_name(l, tg.parent + "." + tg.module + ".weight"),
                           lora_a_name(l, tg), lora_b_name(l, tg)});
    return pairs;
  }

  // Layer l's adapters: per group the targets' A matrices packed back to back, then their
  // B matrices (llama_lora.hpp).
  static UnitLayout adapter_unit(const ModelConfig& c, int l) {
    UnitBuilder b("layers." + std::to_string(l) + ".lora", /*trainable=*/true);
    const int64_t r = c.lora.rank;
    for (const LoraGroup& g : llama_lora_groups(c, 1, l)) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(g.in));
      for (size_t i = 0; i < g.targets.size(); ++i)
        b.add(lora_a_name(l, g.targets[i]), {r, g.in}, ParamInit::uniform, bound, /*pack_with_previous=*/i > 0);
      for (const auto& t : g.targets) b.add(lora_b_name(l, t), {t.out, r}, ParamInit::zeros);
    }
    return b.finish();
  }

  // Expert e of sparse layer l's adapters (llama_lora.hpp): gate_up_proj's A, B, then
  // down_proj's, as targeted; placed and partitioned with the expert.
  static UnitLayout expert_adapter_unit(const ModelConfig& c, int l, int e) {
    UnitBuilder b("layers." + std::to_string(l) + ".experts." + std::to_string(e) + ".lora",
                  /*trainable=*/true);
    const int64_t r = c.lora.rank, C = c.n_embd, Ie = c.moe.expert_intermediate_size;
    auto pair = [&](const char* projection, int64_t in, int64_t out) {
      b.add(expert_lora_name(l, e, projection, 'A'), {r, in}, ParamInit::uniform,
            1.0f / std::sqrt(static_cast<float>(in)));
      b.add(expert_lora_name(l, e, projection, 'B'), {out, r}, ParamInit::zeros);
    };
    if (c.lora.targets_module("experts.gate_up_proj")) pair("gate_up_proj", C, 2 * Ie);
    if (c.lora.targets_module("experts.down_proj")) pair("down_proj", Ie, C);
    UnitLayout u = b.finish();
    u.token_fraction = static_cast<double>(c.moe.top_k) / c.moe.num_experts;
    u.expert = e;
    u.experts = c.moe.num_experts;
    return u;
  }

  LlamaVariant variant_;
  std::string name_;
};

}  // namespace

const ModelFamily& llama_family(LlamaVariant variant) {
  static const LlamaFamily llama(LlamaVariant::llama), qwen2(LlamaVariant::qwen2),
      qwen3(LlamaVariant::qwen3), qwen3_moe(LlamaVariant::qwen3_moe), qwen2_moe(LlamaVariant::qwen2_moe),
      mixtral(LlamaVariant::mixtral);
  switch (variant) {
    case LlamaVariant::llama: return llama;
    case LlamaVariant::qwen2: return qwen2;
    case LlamaVariant::qwen3: return qwen3;
    case LlamaVariant::qwen3_moe: return qwen3_moe;
    case LlamaVariant::qwen2_moe: return qwen2_moe;
    case LlamaVariant::mixtral: return mixtral;
  }
  return llama;
}

}  // namespace shardlm
