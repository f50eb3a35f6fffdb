#include "shardlm/model/config.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"

namespace shardlm {

bool LoraConfig::targets_module(const std::string& module) const {
  for (const auto& t : targets)
    if (t == module) return true;
  return false;
}

const char* base_quant_name(BaseQuant q) { return q == BaseQuant::nf4 ? "nf4" : "none"; }

BaseQuant parse_base_quant(const std::string& name) {
  if (name == "none") return BaseQuant::none;
  if (name == "nf4") return BaseQuant::nf4;
  throw Error(fmt::format("--quantize-base must be none or nf4, got '{}'", name));
}

bool MoeConfig::sparse_layer(int layer) const {
  if (!enabled() || decoder_sparse_step <= 0 || (layer + 1) % decoder_sparse_step != 0) return false;
  for (int l : mlp_only_layers)
    if (l == layer) return false;
  return true;
}

int MoeConfig::sparse_layers(int n_layer) const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += sparse_layer(l) ? 1 : 0;
  return n;
}

void ModelConfig::validate() const {
  const ModelFamily& f = model_family(family);  // throws for an unknown family
  SHARDLM_CHECK(n_layer > 0, "n_layer must be positive, got {}", n_layer);
  SHARDLM_CHECK(n_head > 0, "n_head must be positive, got {}", n_head);
  SHARDLM_CHECK(n_embd > 0, "n_embd must be positive, got {}", n_embd);
  SHARDLM_CHECK(vocab_size > 0, "vocab_size must be positive, got {}", vocab_size);
  SHARDLM_CHECK(max_seq_len > 0, "max_seq_len must be positive, got {}", max_seq_len);
  SHARDLM_CHECK(init_std > 0.0f, "init_std must be positive, got {}", init_std);
  SHARDLM_CHECK(lora.rank >= 0, "--lora-rank must be >= 0, got {}", lora.rank);
  // Every byte count downstream (layouts, plan, checkpoints) is a 64-bit integer: a shape
  // whose parameters could overflow them is refused here, at once, in floating point.
  const double attention = static_cast<double>(n_embd) * head_dim() * (n_head + 2.0 * kv_heads()) +
                           static_cast<double>(head_dim()) * n_head * n_embd;
  const double mlp = 3.0 * static_cast<double>(n_embd) *
                     std::max<double>(mlp_width(), static_cast<double>(moe.num_experts) *
                                                       moe.expert_intermediate_size);
  const double parameters = static_cast<double>(n_layer) * (attention + mlp) +
                            (2.0 * padded_vocab_size() + max_seq_len) * static_cast<double>(n_embd);
  SHARDLM_CHECK(parameters <= kMaxParameters,
                "model shape too large: about {:.3g} parameters ({} layers, {} wide), more than the "
                "{:.0e} whose byte counts shardlm can hold",
                parameters, n_layer, n_embd, kMaxParameters);
  SHARDLM_CHECK(quantize_base == BaseQuant::none || lora.enabled(),
                "--quantize-base {} needs LoRA (--lora-rank > 0): only a frozen base is quantized",
                base_quant_name(quantize_base));
  f.validate(*this);  // the family names what it cannot adapt first
  if (lora.enabled()) {
    SHARDLM_CHECK(std::isfinite(lora.alpha) && lora.alpha > 0, "--lora-alpha must be positive, got {}",
                  lora.alpha);
    SHARDLM_CHECK(!lora.targets.empty(), "--lora-targets names no layer");
  }
}

namespace {

int64_t count_parameters(const ModelConfig& config, bool trainable_only) {
  int64_t total = 0;
  for (const auto& unit : model_family(config.family).model_units(config))
    if (unit.trainable || !trainable_only)
      for (const auto& p : unit.params)
        total += p.valid_rows < 0 ? p.logical_numel() : p.valid_rows * (p.logical_numel() / p.shape[0]);
  return total;
}

}  // namespace

std::string ModelConfig::shape_description() const {
  std::string s = fmt::format("{}, {} layers, {} wide, {} heads", family, n_layer, n_embd, n_head);
  if (kv_heads() != n_head) s += fmt::format(" ({} kv heads)", kv_heads());
  if (head_dim_override > 0) s += fmt::format(", head dim {}", head_dim_override);
  if (intermediate_size > 0) s += fmt::format(", MLP {}", intermediate_size);
  return s + fmt::format(", vocab {}, context {}", vocab_size, max_seq_len);
}

int64_t ModelConfig::num_parameters() const { return count_parameters(*this, false); }

int64_t ModelConfig::num_trainable_parameters() const { return count_parameters(*this, true); }

double ModelConfig::train_flops_per_token(int seq_len) const {
  return model_family(family).train_flops_per_token(*this, seq_len);
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = model_family(family).to_json(*this);
  j["family"] = family;
  if (lora.enabled())
    j["lora"] = {{"rank", lora.rank}, {"alpha", lora.alpha}, {"targets", lora.targets}};
  if (quantize_base != BaseQuant::none) j["quantize_base"] = base_quant_name(quantize_base);
  return j;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  ModelConfig c;
  try {
    c.family = j.at("family").get<std::string>();
    model_family(c.family).from_json(j, c);
    if (j.contains("lora")) {
      const auto& l = j.at("lora");
      c.lora.rank = l.at("rank").get<int>();
      c.lora.alpha = l.at("alpha").get<float>();
      c.lora.targets = l.at("targets").get<std::vector<std::string>>();
    }
    if (j.contains("quantize_base")) c.quantize_base = parse_base_quant(j.at("quantize_base").get<std::string>());
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

// A Llama-family shape as its Hugging Face config.json states it.
struct LlamaShape {
  const char* family;
  int layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, context;
  double rope_theta;
  float norm_eps;
  bool tied;
  double llama3_factor;  // 0: no rope scaling
};

ModelConfig make_llama(const LlamaShape& s) {
  ModelConfig c;
  c.family = s.family;
  c.n_layer = s.layers;
  c.n_embd = s.hidden;
  c.intermediate_size = s.intermediate;
  c.n_head = s.heads;
  c.n_kv_head = s.kv_heads;
  c.head_dim_override = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_seq_len = s.context;
  c.rope_theta = s.rope_theta;
  c.norm_eps = s.norm_eps;
  c.tie_embeddings = s.tied;
  c.qkv_bias = std::string(s.family) == "qwen2";
  c.qk_norm = std::string(s.family) == "qwen3";
  if (s.llama3_factor > 0) {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = s.llama3_factor;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
  }
  return c;
}

// A mixture-of-experts shape on a Llama-family one (its intermediate the dense MLP's).
ModelConfig make_moe(ModelConfig c, int experts, int top_k, int expert_width, bool norm_topk,
                     double aux_coef, bool output_router_logits, std::vector<int> mlp_only = {},
                     int shared_expert_width = 0) {
  c.qk_norm = c.family == "qwen3_moe";
  c.qkv_bias = c.family == "qwen2_moe";  // Qwen2MoeConfig's qkv_bias defaults to true
  c.moe.num_experts = experts;
  c.moe.top_k = top_k;
  c.moe.expert_intermediate_size = expert_width;
  c.moe.norm_topk_prob = norm_topk;
  c.moe.router_aux_loss_coef = aux_coef;
  c.moe.output_router_logits = output_router_logits;
  c.moe.mlp_only_layers = std::move(mlp_only);
  c.moe.shared_expert_intermediate_size = shared_expert_width;
  return c;
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};

// Shapes checked against the published config.json of each model (HF hub:
// HuggingFaceTB/SmolLM2-135M, Qwen/Qwen2.5-0.5B, Qwen/Qwen3-0.6B,
// meta-llama/Llama-3.2-1B, Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B,
// meta-llama/Llama-3.1-70B, Qwen/Qwen3-30B-A3B, Qwen/Qwen1.5-MoE-A2.7B,
// mistralai/Mixtral-8x7B-v0.1). The tiny ones are for tests: odd sizes on purpose.
const Preset kPresets[] = {
    {"gpt2-tiny", [] { return make_gpt2(4, 4, 128, 256); }},
    {"gpt2-small-30m", [] { return make_gpt2(6, 6, 384, 1024); }},
    {"gpt2", [] { return make_gpt2(12, 12, 768, 1024); }},
    {"gpt2-medium", [] { return make_gpt2(24, 16, 1024, 1024); }},
    {"llama-tiny", [] {
       // llama3 scaling whose bands fall inside the tiny context (as transformers wants).
       ModelConfig c = make_llama({"llama", 3, 96, 160, 4, 2, 24, 512, 1024, 10000.0, 1e-5f, false, 8.0});
       c.rope_scaling.original_max_position_embeddings = 256;
       return c;
     }},
    {"qwen2-tiny", [] { return make_llama({"qwen2", 3, 96, 144, 4, 2, 24, 512, 1024, 1e6, 1e-6f, true, 0}); }},
    {"qwen3-tiny", [] { return make_llama({"qwen3", 3, 64, 128, 3, 1, 40, 512, 1024, 1e6, 1e-6f, true, 0}); }},
    // The tiny MoE presets turn the load-balancing loss on (output_router_logits) so
    // that tests and demos exercise it; the published configs leave it off.
    {"qwen3-moe-tiny", [] {
       return make_moe(make_llama({"qwen3_moe", 3, 64, 128, 4, 2, 16, 512, 1024, 1e6, 1e-6f, false, 0}),
                       8, 2, 32, true, 0.001, true, {0});
     }},
    // Qwen2-MoE's own defaults: top-k weights not renormalised; a shared expert; the
    // experts in every other layer (decoder_sparse_step 2: layers 1, 3).
    {"qwen2-moe-tiny", [] {
       ModelConfig c = make_moe(make_llama({"qwen2_moe", 4, 64, 96, 4, 2, 16, 512, 1024, 1e6, 1e-6f, false, 0}),
                                8, 2, 32, false, 0.001, true, {}, 48);
       c.moe.decoder_sparse_step = 2;
       return c;
     }},
    {"mixtral-tiny", [] {
       return make_moe(make_llama({"mixtral", 2, 64, 96, 4, 2, 16, 512, 1024, 1e6, 1e-5f, false, 0}),
                       4, 2, 96, true, 0.02, true);
     }},
    {"smollm2-135m", [] { return make_llama({"llama", 30, 576, 1536, 9, 3, 64, 49152, 8192, 100000.0, 1e-5f, true, 0}); }},
    {"qwen2.5-0.5b", [] { return make_llama({"qwen2", 24, 896, 4864, 14, 2, 64, 151936, 32768, 1e6, 1e-6f, true, 0}); }},
    {"qwen3-0.6b", [] { return make_llama({"qwen3", 28, 1024, 3072, 16, 8, 128, 151936, 40960, 1e6, 1e-6f, true, 0}); }},
    {"llama-3.2-1b", [] { return make_llama({"llama", 16, 2048, 8192, 32, 8, 64, 128256, 131072, 500000.0, 1e-5f, true, 32.0}); }},
    {"qwen3-8b", [] { return make_llama({"qwen3", 36, 4096, 12288, 32, 8, 128, 151936, 40960, 1e6, 1e-6f, false, 0}); }},
    {"llama-3.1-8b", [] { return make_llama({"llama", 32, 4096, 14336, 32, 8, 128, 128256, 131072, 500000.0, 1e-5f, false, 8.0}); }},
    {"qwen2.5-7b", [] { return make_llama({"qwen2", 28, 3584, 18944, 28, 4, 128, 152064, 131072, 1e6, 1e-6f, false, 0}); }},
    {"llama-3.1-70b", [] { return make_llama({"llama", 80, 8192, 28672, 64, 8, 128, 128256, 131072, 500000.0, 1e-5f, false, 8.0}); }},
    {"qwen3-30b-a3b", [] {
       return make_moe(make_llama({"qwen3_moe", 48, 2048, 6144, 32, 4, 128, 151936, 40960, 1e6, 1e-6f, false, 0}),
                       128, 8, 768, true, 0.001, false);
     }},
    {"qwen1.5-moe-a2.7b", [] {
       return make_moe(make_llama({"qwen2_moe", 24, 2048, 5632, 16, 16, 128, 151936, 8192, 1e6, 1e-6f, false, 0}),
                       60, 4, 1408, false, 0.001, false, {}, 5632);
     }},
    {"mixtral-8x7b", [] {
       return make_moe(make_llama({"mixtral", 32, 4096, 14336, 32, 8, 128, 32000, 32768, 1e6, 1e-5f, false, 0}),
                       8, 2, 14336, true, 0.02, false);
     }},
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

bool preset_vocabulary_follows_data(const std::string& name) {
  const bool tiny = name.size() > 5 && name.compare(name.size() - 5, 5, "-tiny") == 0;
  return tiny || model_preset(name).family == "gpt2";
}

ModelConfig model_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return p.make();
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown model preset '{}' (expected one of: {})", name, known));
}

}  // namespace shardlm
