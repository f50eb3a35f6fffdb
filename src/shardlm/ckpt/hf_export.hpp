// Hugging Face interchange: export a checkpoint's weights as a GPT-2 model directory
// (model.safetensors + config.json, GPT2LMHeadModel naming) and import such weights
// into a run's owned slices (`train --init-from`).
#pragma once

#include <string>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/strategy.hpp"

namespace shardlm {

// Writes DIR/model.safetensors (fp32, vocabulary rows unpadded) and DIR/config.json.
// Refuses to overwrite an existing model.safetensors.
void export_hugging_face(const CheckpointReader& checkpoint, const std::string& out_dir);

// The GPT-2 config.json transformers reads for `config`.
std::string hugging_face_config_json(const ModelConfig& config);

// Fills the strategy's owned master slices from PATH (a directory holding
// model.safetensors, or a .safetensors file); AdamW moments are zeroed. Names may
// carry the "transformer." prefix or not; every tensor the model needs must be
// present with its Hugging Face shape (Error naming the tensor and both shapes),
// and a config.json beside it must describe the same model shape. Calls
// strategy.after_load().
void import_hugging_face(const std::string& path, const ModelConfig& config,
                         const ParamLayout& layout, Strategy& strategy);

}  // namespace shardlm
