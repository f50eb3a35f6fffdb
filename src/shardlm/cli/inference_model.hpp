// The model `sample`, `chat` and `eval` run: a checkpoint directory, a run directory
// (its newest valid checkpoint) or a Hugging Face model directory (config.json,
// safetensors weights, tokenizer.json), with its tokenizer, loaded into this process
// and checked finite (train/loaded_model.hpp).
#pragma once

#include <memory>
#include <string>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/train/loaded_model.hpp"

namespace shardlm::cli {

struct InferenceModel {
  ModelConfig config;
  std::string tokenizer_spec;
  std::string source;  // "checkpoint DIR" or "model DIR", for messages
  std::unique_ptr<CheckpointReader> checkpoint;  // null for a Hugging Face directory
  std::unique_ptr<LoadedModel> loaded;
};

// The model's config and tokenizer without its weights (cheap: check flags against it
// before loading).
InferenceModel describe_inference_model(const std::string& path);
// Loads the weights, for batches of up to max_batch rows of max_seq tokens. `use`
// names the purpose in the refusal of non-finite weights ("sample from").
void load_inference_model(InferenceModel& model, const std::string& use, int max_batch,
                          int max_seq);

}  // namespace shardlm::cli
