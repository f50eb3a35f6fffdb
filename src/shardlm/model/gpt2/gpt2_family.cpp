#include "shardlm/model/gpt2/gpt2_family.hpp"

#include <cmath>

#include "shardlm/core/error.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"
#include "shardlm/model/hf_config_fields.hpp"

namespace shardlm {

std::string gpt2_param_name(int layer, const std::string& suffix) {
  return "transformer.h." + std::to_string(layer) + "." + suffix;
}

namespace {

class Gpt2Family final : public ModelFamily {
 public:
  void validate(const ModelConfig& c) const override {
    SHARDLM_CHECK(!c.lora.enabled(),
                  "LoRA adapters are implemented for the llama, qwen2 and qwen3 families, not gpt2 "
                  "(fine-tune gpt2 without --lora-rank)");
    SHARDLM_CHECK(c.n_embd % c.n_head == 0, "n_embd ({}) must be divisible by n_head ({})",
                  c.n_embd, c.n_head);
    SHARDLM_CHECK(c.kv_heads() == c.n_head && c.head_dim() == c.n_embd / c.n_head &&
                      c.mlp_width() == 4 * c.n_embd && !c.qkv_bias && !c.o_bias && !c.qk_norm &&
                      c.rope_scaling.type == "default",
                  "a gpt2 model has {} heads of width {} and an MLP of width {}; "
                  "n_kv_head/head_dim/intermediate_size/rope/qk-norm settings belong to the "
                  "llama, qwen2 and qwen3 families",
                  c.n_head, c.n_embd / c.n_head, 4 * c.n_embd);
  }

  nlohmann::json to_json(const ModelConfig& c) const override {
    return {{"n_layer", c.n_layer},         {"n_head", c.n_head},
            {"n_embd", c.n_embd},           {"vocab_size", c.vocab_size},
            {"max_seq_len", c.max_seq_len}, {"init_std", c.init_std},
            {"tie_embeddings", c.tie_embeddings}};
  }

  void from_json(const nlohmann::json& j, ModelConfig& c) const override {
    c.n_layer = j.at("n_layer").get<int>();
    c.n_head = j.at("n_head").get<int>();
    c.n_embd = j.at("n_embd").get<int>();
    c.vocab_size = j.at("vocab_size").get<int>();
    c.max_seq_len = j.at("max_seq_len").get<int>();
    c.init_std = j.at("init_std").get<float>();
    c.tie_embeddings = j.at("tie_embeddings").get<bool>();
  }

  std::vector<UnitLayout> model_units(const ModelConfig& config) const override {
    const int64_t C = config.n_embd;
    const int64_t V = config.padded_vocab_size();
    const float std = config.init_std;
    const float residual_std = std / std::sqrt(2.0f * static_cast<float>(config.n_layer));
    std::vector<UnitLayout> units;
    UnitBuilder embeddings("embeddings");
    embeddings.add("transformer.wte.weight", {V, C}, ParamInit::normal, std).valid_rows = config.vocab_size;
    embeddings.add("transformer.wpe.weight", {config.max_seq_len, C}, ParamInit::normal, std);
    units.push_back(embeddings.finish());
    for (int l = 0; l < config.n_layer; ++l) {
      UnitBuilder block("h." + std::to_string(l));
      // Weights are stored [in, out] as Hugging Face's Conv1D does: y = x W + b.
      block.add(gpt2_param_name(l, "ln_1.weight"), {C}, ParamInit::ones);
      block.add(gpt2_param_name(l, "ln_1.bias"), {C}, ParamInit::zeros);
      block.add(gpt2_param_name(l, "attn.c_attn.weight"), {C, 3 * C}, ParamInit::normal, std);
      block.add(gpt2_param_name(l, "attn.c_attn.bias"), {3 * C}, ParamInit::zeros);
      block.add(gpt2_param_name(l, "attn.c_proj.weight"), {C, C}, ParamInit::normal, residual_std);
      block.add(gpt2_param_name(l, "attn.c_proj.bias"), {C}, ParamInit::zeros);
      block.add(gpt2_param_name(l, "ln_2.weight"), {C}, ParamInit::ones);
      block.add(gpt2_param_name(l, "ln_2.bias"), {C}, ParamInit::zeros);
      block.add(gpt2_param_name(l, "mlp.c_fc.weight"), {C, 4 * C}, ParamInit::normal, std);
      block.add(gpt2_param_name(l, "mlp.c_fc.bias"), {4 * C}, ParamInit::zeros);
      block.add(gpt2_param_name(l, "mlp.c_proj.weight"), {4 * C, C}, ParamInit::normal, residual_std);
      block.add(gpt2_param_name(l, "mlp.c_proj.bias"), {C}, ParamInit::zeros);
      units.push_back(block.finish());
    }
    UnitBuilder final_unit("final");
    final_unit.add("transformer.ln_f.weight", {C}, ParamInit::ones);
    final_unit.add("transformer.ln_f.bias", {C}, ParamInit::zeros);
    if (!config.tie_embeddings)
      final_unit.add("lm_head.weight", {V, C}, ParamInit::normal, std).valid_rows = config.vocab_size;
    units.push_back(final_unit.finish());
    return units;
  }

  std::vector<std::vector<int>> unit_needs(const ModelConfig& config) const override {
    std::vector<std::vector<int>> needs;
    const int final_unit = config.n_layer + 1;
    for (int u = 0; u <= final_unit; ++u)
      needs.push_back(u == final_unit && config.tie_embeddings ? std::vector<int>{0, u}
                                                               : std::vector<int>{u});
    return needs;
  }

  double train_flops_per_token(const ModelConfig& config, int seq_len) const override {
    // 6 flops per parameter touched per token (forward 2, backward 4) for the matmul
    // weights including the LM head, plus causal attention scores and values:
    // forward 2 * 2 * T * C per layer, halved by causality, times 3 for backward.
    const double C = config.n_embd;
    const double matmul_params =
        config.n_layer * 12.0 * C * C + static_cast<double>(config.padded_vocab_size()) * C;
    const double attention = config.n_layer * 6.0 * seq_len * C;  // 3 x (2*2*T*C / 2)
    return 6.0 * matmul_params + attention;
  }

  std::unique_ptr<Model> make_model(const ModelConfig& config, const ParamLayout& layout,
                                    int max_batch, int max_seq, const ModelOptions& options,
                                    MemoryTracker& tracker) const override {
    return std::make_unique<Gpt2Model>(config, layout, max_batch, max_seq, options, tracker);
  }

  ModelMemoryPlan plan_memory(const ModelConfig& config, int max_batch, int max_seq,
                              const ModelOptions& options,
                              bool params_in_compute_type) const override {
    return Gpt2Model::plan_memory(config, max_batch, max_seq, options, params_in_compute_type);
  }

  ModelConfig config_from_hf(const nlohmann::json& hf) const override {
    HfConfigFields f(hf, "gpt2");
    ModelConfig c;
    c.family = "gpt2";
    c.n_layer = f.require_int("n_layer");
    c.n_head = f.require_int("n_head");
    c.n_embd = f.require_int("n_embd");
    c.vocab_size = f.require_int("vocab_size");
    c.max_seq_len = f.require_int("n_positions");
    f.expect_int_or_null("n_ctx", c.max_seq_len);
    f.expect_int_or_null("n_inner", 4 * c.n_embd);
    f.expect_string("activation_function", {"gelu_new", "gelu_pytorch_tanh"});
    f.expect_number("layer_norm_epsilon", 1e-5);
    f.expect_bool("scale_attn_weights", true);
    f.expect_bool("scale_attn_by_inverse_layer_idx", false);
    f.expect_bool("reorder_and_upcast_attn", false);
    f.expect_bool("add_cross_attention", false);
    for (const char* dropout : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) f.expect_no_dropout(dropout);
    c.tie_embeddings = f.optional_bool("tie_word_embeddings", true);
    c.init_std = static_cast<float>(f.optional_number("initializer_range", 0.02));
    f.finish();
    return c;
  }

  nlohmann::json hf_config(const ModelConfig& c) const override {
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.max_seq_len},
            {"n_ctx", c.max_seq_len},
            {"n_embd", c.n_embd},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", 1e-5},
            {"initializer_range", c.init_std},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", c.tie_embeddings},
            {"torch_dtype", "float32"}};
  }

  // Files saved from GPT2Model (not GPT2LMHeadModel) lack the "transformer." prefix;
  // old ones carry causal-mask buffers.
  std::string hf_name(const std::string& stored) const override {
    auto ends_with = [&](const std::string& suffix) {
      return stored.size() >= suffix.size() &&
             stored.compare(stored.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) return "";
    if (stored.rfind("transformer.", 0) == 0 || stored == "lm_head.weight") return stored;
    return "transformer." + stored;
  }
};

}  // namespace

const ModelFamily& gpt2_family() {
  static const Gpt2Family family;
  return family;
}

}  // namespace shardlm
