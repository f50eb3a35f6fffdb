// A QLoRA model that splits over 2 and 4 tensor ranks block for block: head_dim 64 and
// an MLP of 256 make every piece's runs multiples of NF4's 64-value blocks (llama-tiny's
// head_dim 24 does not: refused). Adapters on every module, the base NF4.
#pragma once

#include "shardlm/model/config.hpp"

namespace shardlm {

inline ModelConfig qlora_tensor_parallel_config(ModelConfig c) {
  c.n_embd = 128;
  c.head_dim_override = 64;
  c.intermediate_size = 256;
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  c.quantize_base = BaseQuant::nf4;
  return c;
}

}  // namespace shardlm
