// The GPT-2 family (Hugging Face GPT2LMHeadModel): learned positions, LayerNorm,
// fused qkv, GELU (tanh) MLP of width 4C, weights stored [in, out] as HF's Conv1D.
#pragma once

#include <string>

#include "shardlm/model/family.hpp"

namespace shardlm {

const ModelFamily& gpt2_family();

// Hugging Face names for GPT-2 block tensors (`transformer.h.3.attn.c_attn.weight`).
std::string gpt2_param_name(int layer, const std::string& suffix);

}  // namespace shardlm
