// The Llama families: Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query
// attention, no biases), Qwen2 (+ q/k/v biases) and Qwen3 (+ per-head RMSNorm of q and
// k before RoPE, explicit head_dim), and their mixtures of experts: Qwen3-MoE (Qwen3's
// attention), Qwen2-MoE (Qwen2's, plus a gated shared expert) and Mixtral (Llama's),
// whose sparse layers route each token to top-k SwiGLU experts (config.moe,
// model/moe/). One model computes all six; the config's flags (qkv_bias, o_bias,
// qk_norm, moe) say which parts exist.
//
// Tensors are stored as Hugging Face stores them (nn.Linear weights [out, in]), under
// HF's names, so import and export copy tensors by name. Within a block the q, k and v
// projections are packed back to back (one [(H + 2 KV) hd, C] matrix: one GEMM makes
// q, k and v), and so are gate_proj and up_proj ([2 I, C]).
#pragma once

#include <string>

#include "shardlm/model/family.hpp"

namespace shardlm {

enum class LlamaVariant { llama, qwen2, qwen3, qwen3_moe, qwen2_moe, mixtral };

const ModelFamily& llama_family(LlamaVariant variant);

// "model.layers.3." + suffix
std::string llama_param_name(int layer, const std::string& suffix);

}  // namespace shardlm
