#include "shardlm/model/moe/moe_names.hpp"

namespace shardlm {

MoeNames::Expert MoeNames::expert(int layer, int e) const {
  const std::string prefix =
      "model.layers." + std::to_string(layer) + "." + block + ".experts." + std::to_string(e) + ".";
  return {prefix + gate + ".weight", prefix + up + ".weight", prefix + down + ".weight"};
}

const MoeNames& moe_names(const ModelConfig& config) {
  static const MoeNames qwen{"mlp", "gate_proj", "up_proj", "down_proj"};
  static const MoeNames mixtral{"block_sparse_moe", "w1", "w3", "w2"};
  return config.family == "mixtral" ? mixtral : qwen;
}

}  // namespace shardlm
