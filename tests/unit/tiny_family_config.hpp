// The small configuration of each family that the per-family model tests run (a
// preset, vocabulary 97, 32 positions; GPT-2 cut to 2 layers of 32).
#pragma once

#include <string>

#include "shardlm/model/config.hpp"

namespace shardlm {

inline ModelConfig tiny_family_config(const std::string& preset) {
  ModelConfig c = model_preset(preset);
  c.vocab_size = 97;
  c.max_seq_len = 32;
  if (c.family == "gpt2") {
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
  }
  return c;
}

}  // namespace shardlm
