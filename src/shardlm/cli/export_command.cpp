#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_export.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm::cli {

void register_export(CLI::App& app) {
  auto checkpoint = std::make_shared<std::string>();
  auto options = std::make_shared<HfExportOptions>();
  auto dtype = std::make_shared<std::string>("fp32");
  auto shard_gb = std::make_shared<double>(5.0);
  auto* cmd = app.add_subcommand(
      "export", "Write a checkpoint as a Hugging Face model directory (its family's config.json, "
                "safetensors weights, tokenizer files of the model it started from)");
  cmd->add_option("--checkpoint", *checkpoint, "Checkpoint directory or run directory")->required();
  cmd->add_option("--out", options->out_dir, "Output directory")->required();
  cmd->add_option("--dtype", *dtype, "Stored type of the weights: fp32, bf16 or fp16")
      ->capture_default_str();
  cmd->add_option("--max-shard-size", *shard_gb,
                  "Largest safetensors file in GB (10^9 bytes); larger models are sharded with an "
                  "index")
      ->capture_default_str();
  auto merge = std::make_shared<bool>(false);
  auto adapter_only = std::make_shared<bool>(false);
  auto base_only = std::make_shared<bool>(false);
  auto* merge_flag = cmd->add_flag("--merge-lora", *merge,
                                   "LoRA run: write the base with the adapters merged in (a plain "
                                   "model directory)");
  cmd->add_flag("--adapter-only", *adapter_only,
                "LoRA run: write the adapters as a PEFT directory (the default for a LoRA run)")
      ->excludes(merge_flag);
  cmd->add_flag("--base-only", *base_only,
                "LoRA run: write the frozen base alone (a QLoRA base dequantized), without the "
                "adapters")
      ->excludes(merge_flag);
  cmd->callback([checkpoint, options, dtype, shard_gb, merge, adapter_only, base_only]() {
    options->dtype = parse_dtype(*dtype, "--dtype");
    SHARDLM_CHECK(!(*base_only && *adapter_only), "--base-only and --adapter-only exclude each other");
    options->lora = *merge        ? LoraExport::merge
                    : *base_only  ? LoraExport::base_only
                    : *adapter_only ? LoraExport::adapter_only
                                    : LoraExport::automatic;
    SHARDLM_CHECK(std::isfinite(*shard_gb) && *shard_gb > 0,
                  "--max-shard-size must be a positive number of GB, got {}", *shard_gb);
    options->max_shard_bytes = static_cast<int64_t>(*shard_gb * 1e9);
    const auto opened = open_checkpoint(*checkpoint, print_checkpoint_warning);
    const CheckpointReader& ckpt = *opened;
    export_hugging_face(ckpt, *options);
    fmt::print("exported {} (step {}, {}) to {} ({})\n", ckpt.dir(), ckpt.info().step,
               ckpt.info().model.family, options->out_dir, *dtype);
  });
}

}  // namespace shardlm::cli
