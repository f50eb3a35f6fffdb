// A checkpoint tensor's values in fp32 as the run computes with them: its master
// weights, or an NF4 tensor's words dequantized (QLoRA's frozen base, which stores
// fewer words than it has values); a vocabulary matrix without its padding rows.
#pragma once

#include <vector>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

// `param`: the tensor's entry in a layout of the checkpoint's model config.
std::vector<float> read_tensor_values(const CheckpointReader& checkpoint, const ParamInfo& param);

}  // namespace shardlm
