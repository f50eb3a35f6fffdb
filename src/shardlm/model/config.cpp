#include "shardlm/model/config.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"

namespace shardlm {

void ModelConfig::validate() const {
  SHARDLM_CHECK(family == "gpt2", "model family '{}' is not supported (expected gpt2)", family);
  SHARDLM_CHECK(n_layer > 0, "n_layer must be positive, got {}", n_layer);
  SHARDLM_CHECK(n_head > 0, "n_head must be positive, got {}", n_head);
  SHARDLM_CHECK(n_embd > 0, "n_embd must be positive, got {}", n_embd);
  SHARDLM_CHECK(vocab_size > 0, "vocab_size must be positive, got {}", vocab_size);
  SHARDLM_CHECK(max_seq_len > 0, "max_seq_len must be positive, got {}", max_seq_len);
  SHARDLM_CHECK(n_embd % n_head == 0, "n_embd ({}) must be divisible by n_head ({})", n_embd,
                n_head);
  SHARDLM_CHECK(init_std > 0.0f, "init_std must be positive, got {}", init_std);
}

int64_t ModelConfig::num_parameters() const {
  const int64_t C = n_embd;
  int64_t per_block = 2 * C                      // ln_1
                      + C * 3 * C + 3 * C        // c_attn
                      + C * C + C                // attn.c_proj
                      + 2 * C                    // ln_2
                      + C * 4 * C + 4 * C        // c_fc
                      + 4 * C * C + C;           // mlp.c_proj
  int64_t total = static_cast<int64_t>(vocab_size) * C + static_cast<int64_t>(max_seq_len) * C +
                  n_layer * per_block + 2 * C;
  if (!tie_embeddings) total += static_cast<int64_t>(vocab_size) * C;
  return total;
}

double ModelConfig::train_flops_per_token(int seq_len) const {
  // 6 flops per parameter touched per token (forward 2, backward 4) for the matmul
  // weights including the LM head, plus causal attention scores and values:
  // forward 2 * 2 * T * C per layer, halved by causality, times 3 for backward.
  const double C = n_embd;
  double matmul_params = n_layer * 12.0 * C * C + static_cast<double>(padded_vocab_size()) * C;
  double attention = n_layer * 6.0 * seq_len * C;  // 3 x (2*2*T*C / 2)
  return 6.0 * matmul_params + attention;
}

nlohmann::json ModelConfig::to_json() const {
  return {{"family", family},         {"n_layer", n_layer},       {"n_head", n_head},
          {"n_embd", n_embd},         {"vocab_size", vocab_size}, {"max_seq_len", max_seq_len},
          {"init_std", init_std},     {"tie_embeddings", tie_embeddings}};
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  ModelConfig c;
  try {
    c.family = j.at("family").get<std::string>();
    c.n_layer = j.at("n_layer").get<int>();
    c.n_head = j.at("n_head").get<int>();
    c.n_embd = j.at("n_embd").get<int>();
    c.vocab_size = j.at("vocab_size").get<int>();
    c.max_seq_len = j.at("max_seq_len").get<int>();
    c.init_std = j.at("init_std").get<float>();
    c.tie_embeddings = j.at("tie_embeddings").get<bool>();
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
}  // namespace

std::vector<std::string> model_preset_names() {
  return {"gpt2-tiny", "gpt2-small-30m", "gpt2", "gpt2-medium"};
}

ModelConfig model_preset(const std::string& name) {
  if (name == "gpt2-tiny") return make_gpt2(4, 4, 128, 256);
  if (name == "gpt2-small-30m") return make_gpt2(6, 6, 384, 1024);
  if (name == "gpt2") return make_gpt2(12, 12, 768, 1024);
  if (name == "gpt2-medium") return make_gpt2(24, 16, 1024, 1024);
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown model preset '{}' (expected one of: {})", name, known));
}

}  // namespace shardlm
