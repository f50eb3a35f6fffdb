// Hugging Face model directories in: the model a config.json describes, and its
// weights loaded into a run's owned slices (`train --init-from DIR`, `--model DIR`).
#pragma once

#include <string>

#include "shardlm/model/config.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/owned_state.hpp"

namespace shardlm {

// Whether `path` is a Hugging Face model directory (it holds config.json) or a
// config.json file.
bool is_hf_model_path(const std::string& path);

// The ModelConfig that PATH/config.json (or the config.json file PATH) describes,
// through its model_type's family: every field that changes the computation honoured
// or refused by name.
ModelConfig read_hf_model_config(const std::string& path);

// Error unless the config.json beside the weights at PATH (if any) describes `config`
// (the first field that differs is named; the run's adapters and --quantize-base are
// its own, not the base's) and the weight files hold exactly the tensors the model
// imports, with their Hugging Face shapes and a dtype the import reads. Reads headers
// only: a run calls it before it creates anything. What it cannot see without the
// data (non-finite values) import_hugging_face checks, still before training starts.
void check_hf_model_matches(const std::string& path, const ModelConfig& config);

// Fills the owned parameters from PATH: a directory holding
// model.safetensors or a sharded model.safetensors.index.json, or one .safetensors
// file; stored as fp32, bf16, fp16 or fp64. AdamW moments are zeroed. A config.json
// beside the weights must describe `config` (Error naming the first field that
// differs); every tensor the model needs must be present with its Hugging Face shape,
// and every stored tensor must be one the model has (Error naming the tensor).
// In a LoRA run only the base (frozen units) is imported; the adapter units' masters
// are left as the caller initialised them. A QLoRA base weight is quantized to NF4 on
// load; a frozen unit of a bf16/fp16 run is rounded to that type once (nearest even).
// Calls state.after_load().
void import_hugging_face(const std::string& path, const ModelConfig& config,
                         const ParamLayout& layout, OwnedState& state);

}  // namespace shardlm
