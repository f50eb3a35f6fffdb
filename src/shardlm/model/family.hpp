// ModelFamily: everything that distinguishes one architecture from another, as data
// (its tensors per model unit, with Hugging Face names, shapes, init and weight decay)
// plus a few functions (FLOPs, the model object, its memory, Hugging Face config
// fields). ParamLayout, parameter counts, checkpoints, `plan` and Hugging Face
// import/export are all derived from it, so adding a family touches its own folder
// and the registry in family.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

// A LoRA-adapted weight: weight += scale * B A (for --merge-lora).
struct LoraPair {
  std::string weight, a, b;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  // Throws Error naming the field when the config is not one this family computes.
  virtual void validate(const ModelConfig& config) const = 0;
  // The config's fields that this family reads, as written to config.json of a run
  // and to checkpoints (and read back by ModelConfig::from_json).
  virtual nlohmann::json to_json(const ModelConfig& config) const = 0;
  virtual void from_json(const nlohmann::json& j, ModelConfig& config) const = 0;

  // The model units in step order, each with its parameters laid out from offset 0
  // (ParamLayout::build places and merges them).
  virtual std::vector<UnitLayout> model_units(const ModelConfig& config) const = 0;
  // Per model unit: the model units whose parameters it reads.
  virtual std::vector<std::vector<int>> unit_needs(const ModelConfig& config) const = 0;
  virtual double train_flops_per_token(const ModelConfig& config, int seq_len) const = 0;

  virtual std::unique_ptr<Model> make_model(const ModelConfig& config, const ParamLayout& layout,
                                            int max_batch, int max_seq,
                                            const ModelOptions& options,
                                            MemoryTracker& tracker) const = 0;
  // Bytes make_model and the first step allocate. params_in_compute_type: the
  // strategy hands the model parameters in the compute type, sparing a weight scratch.
  virtual ModelMemoryPlan plan_memory(const ModelConfig& config, int max_batch, int max_seq,
                                      const ModelOptions& options,
                                      bool params_in_compute_type) const = 0;

  // Hugging Face interchange. config_from_hf honours every config.json field that
  // changes the computation or refuses it by name; hf_config writes config.json.
  // hf_name maps a Hugging Face tensor name as stored in a file to shardlm's name
  // (which is Hugging Face's canonical one), or "" for a tensor that is not a weight
  // (old GPT-2 files' causal-mask buffers).
  virtual ModelConfig config_from_hf(const nlohmann::json& hf) const = 0;
  virtual nlohmann::json hf_config(const ModelConfig& config) const = 0;
  virtual std::string hf_name(const std::string& stored_name) const { return stored_name; }
  // The base weights a LoRA config adapts, with their A and B (empty: no LoRA).
  virtual std::vector<LoraPair> lora_pairs(const ModelConfig& /*config*/) const { return {}; }
};

// The family of config.family ("gpt2", "llama", "qwen2", "qwen3"); Error otherwise.
const ModelFamily& model_family(const std::string& family);
// The family whose Hugging Face model_type this is (config.json's "model_type").
const ModelFamily& model_family_for_hf(const std::string& model_type);
std::vector<std::string> model_family_names();

// Builds the tensors of one model unit in order, each at the next aligned offset
// (ParamLayout::kParamAlignment), or right after the previous one with
// pack_with_previous (tensors a kernel reads as one matrix, e.g. q/k/v projections).
class UnitBuilder {
 public:
  explicit UnitBuilder(std::string name, bool trainable = true) {
    unit_.name = std::move(name);
    unit_.trainable = trainable;
  }
  ParamInfo& add(std::string name, std::vector<int64_t> shape, ParamInit init,
                 float init_std = 0.0f, bool pack_with_previous = false);
  // A weight stored as NF4 (ParamStorage::nf4; the unit becomes raw), at the next
  // aligned offset. Its init draws the fp32 values as add's would, then quantizes them.
  ParamInfo& add_nf4(std::string name, std::vector<int64_t> shape, ParamInit init,
                     float init_std);
  UnitLayout finish() { return std::move(unit_); }

 private:
  UnitLayout unit_;
};

// Elements [begin, end) of flat unit `unit`'s init into out[0, end - begin): each
// parameter per its ParamInfo::init (normal with init_std from a stream seeded by
// (seed, parameter name), uniform likewise, ones, zeros); padding and padded vocabulary rows zero.
// An NF4 parameter's words are its fp32 init quantized (nf4_quantize), so a QLoRA
// run's base is the LoRA run's base of the same seed, quantized.
// Depends on nothing but the seed and the names, so not on world size or merging.
void init_param_range(const UnitLayout& unit, uint64_t seed, int64_t begin, int64_t end,
                      float* out);

}  // namespace shardlm
