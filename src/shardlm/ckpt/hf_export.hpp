// Hugging Face model directories out: a checkpoint's weights as the family's
// transformers model directory (`shardlm export`).
#pragma once

#include <cstdint>
#include <string>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/core/dtype.hpp"

namespace shardlm {

// What export writes of a LoRA run: its adapters as a PEFT adapter directory
// (adapter_config.json + adapter_model.safetensors, loadable with
// PeftModel.from_pretrained onto the base), or the base with the adapters merged in
// (W + alpha/r B A: a plain model directory). `automatic`: the adapter for a LoRA run,
// the model otherwise; base_only: the frozen base alone, as the run computes with it (a
// QLoRA run's NF4 base dequantized: what "LoRA on the dequantized base" starts from).
// The explicit ones refuse a run without LoRA. A QLoRA run's merged export dequantizes
// the base (fp32 code x absmax) before adding the adapters.
enum class LoraExport { automatic, adapter_only, merge, base_only };

struct HfExportOptions {
  std::string out_dir;
  LoraExport lora = LoraExport::automatic;
  DType dtype = DType::fp32;                  // stored type of the weights
  int64_t max_shard_bytes = 5'000'000'000;    // larger models are split (HF's "5GB" default)
};

// Writes OUT/config.json (the family's, torch_dtype set), generation_config.json,
// model.safetensors (or model-0000i-of-0000n.safetensors + model.safetensors.index.json
// above max_shard_bytes), vocabulary rows unpadded, and the tokenizer files of the
// model the run started from (or of the data's Hugging Face tokenizer) when they can
// be found. Never overwrites: Error when OUT already holds any of those files. All
// files are written under a temporary name first and renamed when complete, so a
// failed export leaves nothing behind.
void export_hugging_face(const CheckpointReader& checkpoint, const HfExportOptions& options);

}  // namespace shardlm
