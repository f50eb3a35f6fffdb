// Hugging Face names of a sparse layer's router and experts, as transformers 5.24
// writes them (save_pretrained reverts its fused in-memory gate_up_proj/down_proj to
// one tensor per expert, conversion_mapping.py) and every published checkpoint has them:
//   qwen3_moe  model.layers.L.mlp.gate.weight [E, C]
//              model.layers.L.mlp.experts.N.{gate_proj,up_proj}.weight [I, C], down_proj [C, I]
//   mixtral    model.layers.L.block_sparse_moe.gate.weight
//              model.layers.L.block_sparse_moe.experts.N.{w1,w3}.weight [I, C], w2 [C, I]
#pragma once

#include <string>

#include "shardlm/model/config.hpp"

namespace shardlm {

struct MoeNames {
  std::string block;             // "mlp", "block_sparse_moe"
  std::string gate, up, down;    // an expert's modules (gate_proj, up_proj, down_proj)

  // "block.gate.weight": the router, relative to the layer.
  std::string router_suffix() const { return block + ".gate.weight"; }
  struct Expert {
    std::string gate, up, down;  // full names
  };
  Expert expert(int layer, int e) const;
};

const MoeNames& moe_names(const ModelConfig& config);

}  // namespace shardlm
