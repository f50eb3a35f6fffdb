#include "shardlm/cli/inference_model.hpp"

#include <filesystem>

#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm::cli {

InferenceModel describe_inference_model(const std::string& path) {
  InferenceModel m;
  // A run directory holds a config.json of its own: a Hugging Face directory is one
  // with weights beside its config.json and no checkpoints.
  const std::filesystem::path dir(path);
  const bool hf = is_hf_model_path(path) && !std::filesystem::exists(dir / "manifest.json") &&
                  !std::filesystem::exists(dir / "checkpoints") &&
                  (std::filesystem::exists(dir / "model.safetensors") ||
                   std::filesystem::exists(dir / "model.safetensors.index.json"));
  if (hf) {
    SHARDLM_CHECK(std::filesystem::is_directory(path),
                  "--checkpoint '{}' is a config.json file; give the model directory that holds "
                  "it, its weights and tokenizer.json", path);
    m.config = read_hf_model_config(path);
    m.tokenizer_spec = path;  // a directory holding tokenizer.json means hf:DIR
    m.source = fmt::format("model '{}'", path);
    return m;
  }
  m.checkpoint = open_checkpoint(path, print_checkpoint_warning);
  m.config = m.checkpoint->info().model;
  m.tokenizer_spec = m.checkpoint->info().tokenizer;
  m.source = fmt::format("checkpoint '{}'", m.checkpoint->dir());
  return m;
}

void load_inference_model(InferenceModel& m, const std::string& use, int max_batch, int max_seq) {
  // Inference keeps only each layer's input (the rest of a layer's activations are
  // for backward), so the arena stays small at long contexts; the forward is bitwise
  // the same.
  ModelOptions options;
  options.activation_checkpointing = true;
  if (m.checkpoint)
    m.loaded = std::make_unique<LoadedModel>(*m.checkpoint, max_batch, max_seq, use, options);
  else
    m.loaded = std::make_unique<LoadedModel>(m.tokenizer_spec, m.config, max_batch, max_seq, use,
                                             options);
}

}  // namespace shardlm::cli
