// A model's rotary embedding frequency scaling (Hugging Face `rope_scaling`), shared by
// the model config (model/config.hpp) and the RoPE kernels (backend/cpu/rope.hpp).
#pragma once

#include <string>

namespace shardlm {

// "default": none; "llama3": Llama 3.1/3.2's smooth low-frequency interpolation.
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling&) const = default;
};

}  // namespace shardlm
