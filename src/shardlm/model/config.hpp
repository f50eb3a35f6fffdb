// ModelConfig: the shape of a decoder-only model, named presets, and validation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

struct ModelConfig {
  std::string family = "gpt2";  // "gpt2" (Llama/Qwen families later)
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;       // the tokenizer's vocabulary (loss is over these ids only)
  int max_seq_len = 1024;   // context length: size of the learned position table
  float init_std = 0.02f;   // GPT-2 init; residual projections get init_std / sqrt(2 * n_layer)
  bool tie_embeddings = true;  // LM head reuses the token embedding (GPT-2)

  // Rows of the embedding / logits padded to a multiple of 64 for GEMM speed; padded
  // logits never enter the softmax and padded rows stay exactly zero.
  static constexpr int kVocabPadMultiple = 64;
  int padded_vocab_size() const {
    return (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple;
  }
  int head_dim() const { return n_embd / n_head; }

  // Throws Error naming the field if a size is not positive or n_embd % n_head != 0.
  void validate() const;
  // Parameter count without vocabulary padding (what Hugging Face reports).
  int64_t num_parameters() const;
  // Model FLOPs per token for a training step (6N + attention), for MFU and GFLOP/s.
  double train_flops_per_token(int seq_len) const;

  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json& j);  // throws Error on missing fields
  bool operator==(const ModelConfig&) const = default;
};

// Presets: gpt2-tiny (~1M params, for tests), gpt2-small-30m, gpt2 (124M),
// gpt2-medium (350M). The vocabulary defaults to GPT-2's 50257; `train` overrides it
// with the data's vocabulary when the flag is not given.
ModelConfig model_preset(const std::string& name);  // throws Error on unknown name
std::vector<std::string> model_preset_names();

}  // namespace shardlm
