// ModelConfig: the shape of a decoder-only model of any family shardlm computes
// (gpt2, llama, qwen2, qwen3), named presets, and validation. What a field means for
// a family, and which fields a family uses at all, is the family's business
// (model/family.hpp); this struct only holds the values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "shardlm/core/rope_scaling.hpp"

namespace shardlm {

// LoRA adapters (PEFT's LoraConfig): on each targeted linear layer W [out, in] of
// every decoder layer, y = x W^T + (alpha / rank) (x A^T) B^T with A [rank, in] (init
// uniform in +-1/sqrt(in), PEFT's kaiming_uniform(a=sqrt(5))) and B [out, rank] (init
// 0). The base model is frozen: no gradients, optimizer state or reduction for it.
struct LoraConfig {
  int rank = 0;  // 0: no adapters (every parameter trains)
  float alpha = 16.0f;
  std::vector<std::string> targets;  // module names of the family, e.g. q_proj, v_proj
  bool enabled() const { return rank > 0; }
  float scale() const { return alpha / static_cast<float>(rank); }
  bool targets_module(const std::string& module) const;
  bool operator==(const LoraConfig&) const = default;
};

// --quantize-base: how a LoRA run stores its frozen base's linear weights (QLoRA:
// nf4, 4-bit NormalFloat; embeddings, norms and the LM head stay as they are).
enum class BaseQuant { none, nf4 };
const char* base_quant_name(BaseQuant q);
BaseQuant parse_base_quant(const std::string& name);  // Error naming --quantize-base

// Mixture-of-experts feed-forward (qwen3_moe, qwen2_moe, mixtral; docs/models.md): in a
// sparse layer a linear router (softmax over num_experts, top_k kept, renormalised when
// norm_topk_prob) sends each token to top_k SwiGLU experts whose outputs are summed
// with those weights; qwen2_moe adds a shared expert (a SwiGLU MLP over every token)
// scaled per token by sigmoid(h2 . shared_expert_gate). Dense layers (mlp_only_layers,
// or not a multiple of decoder_sparse_step) keep the ordinary MLP of intermediate_size.
struct MoeConfig {
  int num_experts = 0;  // 0: a dense model
  int top_k = 0;        // num_experts_per_tok
  int expert_intermediate_size = 0;  // each expert's MLP width (moe_intermediate_size)
  bool norm_topk_prob = true;
  int decoder_sparse_step = 1;       // layer l is sparse when (l + 1) % step == 0 ...
  std::vector<int> mlp_only_layers;  // ... and l is not listed here
  // transformers adds router_aux_loss_coef x the load-balancing loss to the loss only
  // when output_router_logits is set (its default is off).
  double router_aux_loss_coef = 0.0;
  bool output_router_logits = false;
  int shared_expert_intermediate_size = 0;  // qwen2_moe's shared expert; 0: none

  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  bool enabled() const { return num_experts > 0; }
  bool sparse_layer(int layer) const;
  int sparse_layers(int n_layer) const;
  double aux_loss_coef() const { return output_router_logits ? router_aux_loss_coef : 0.0; }
  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  std::string family = "gpt2";  // gpt2, llama, qwen2, qwen3, qwen3_moe, qwen2_moe, mixtral
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;       // rows of the embedding as Hugging Face has them; the loss is
                            // over these ids only
  int max_seq_len = 1024;   // context length (GPT-2: size of the learned position table)
  float init_std = 0.02f;   // normal init; GPT-2's residual projections get std / sqrt(2 L)
  bool tie_embeddings = true;  // the LM head reuses the token embedding

  // Llama families (ignored by gpt2, which fixes them: MHA, 4C MLP, LayerNorm 1e-5).
  int n_kv_head = 0;          // key/value heads (grouped-query attention); 0: n_head
  int head_dim_override = 0;  // per-head width; 0: n_embd / n_head
  int intermediate_size = 0;  // MLP width; 0: 4 n_embd
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;     // RMSNorm epsilon
  bool qkv_bias = false;      // q/k/v projections have biases (qwen2; llama/qwen3 attention_bias)
  bool o_bias = false;        // the output projection has a bias (llama/qwen3 attention_bias)
  bool qk_norm = false;       // per-head RMSNorm of q and k before RoPE (qwen3)

  MoeConfig moe;              // experts (qwen3_moe, qwen2_moe, mixtral); moe.num_experts 0: dense

  LoraConfig lora;            // adapters on a frozen base (LoRA fine-tuning)
  BaseQuant quantize_base = BaseQuant::none;  // needs lora; JSON "quantize_base" when not none

  // Rows of the embedding / logits padded to a multiple of 64 for GEMM speed; padded
  // logits never enter the softmax and padded rows stay exactly zero.
  static constexpr int kVocabPadMultiple = 64;
  int padded_vocab_size() const {
    return (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple;
  }
  int head_dim() const { return head_dim_override > 0 ? head_dim_override : n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int mlp_width() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }

  // Throws Error naming the field if the family is unknown or a value is out of range
  // for it, or when the shape has more than kMaxParameters (about 1,000x the largest
  // models trained today, and small enough that every byte count fits in int64 with
  // room for optimizer state and activations).
  static constexpr double kMaxParameters = 1e15;
  void validate() const;
  // Parameter count without vocabulary padding (what Hugging Face reports), from the
  // family's tensors.
  int64_t num_parameters() const;
  // The part of num_parameters() that trains (a LoRA run: the adapters; else all).
  int64_t num_trainable_parameters() const;
  // Model FLOPs per token for a training step (6N + attention), for MFU and GFLOP/s.
  double train_flops_per_token(int seq_len) const;

  // The family's fields only (a GPT-2 config reads as it always has).
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json& j);  // throws Error on missing fields
  bool operator==(const ModelConfig&) const = default;
  // Its shape in a phrase, for errors that compare two models: "gpt2, 2 layers, 32 wide,
  // 2 heads, vocab 256, context 256" (kv heads, head and MLP widths where a family has them).
  std::string shape_description() const;
};

// Presets with the shapes of public models: gpt2-tiny (tests), gpt2-small-30m, gpt2
// (124M), gpt2-medium (350M); llama-tiny, qwen2-tiny, qwen3-tiny, qwen3-moe-tiny,
// qwen2-moe-tiny, mixtral-tiny (tests);
// smollm2-135m, qwen2.5-0.5b, qwen3-0.6b, llama-3.2-1b; for planning qwen3-8b,
// llama-3.1-8b, qwen2.5-7b, llama-3.1-70b, qwen3-30b-a3b, qwen1.5-moe-a2.7b, mixtral-8x7b. GPT-2 presets default to GPT-2's 50257-token
// vocabulary, which `train` replaces with the data's when the flag is not given.
ModelConfig model_preset(const std::string& name);  // throws Error on unknown name
std::vector<std::string> model_preset_names();
// GPT-2 presets and the tiny test presets take the data's vocabulary; the presets of
// real models keep their own.
bool preset_vocabulary_follows_data(const std::string& name);

}  // namespace shardlm
