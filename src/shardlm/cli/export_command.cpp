#include <fmt/format.h>

#include <memory>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_export.hpp"
#include "shardlm/cli/commands.hpp"

namespace shardlm::cli {

void register_export(CLI::App& app) {
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "export", "Write a checkpoint's weights as a Hugging Face GPT-2 model directory");
  cmd->add_option("--checkpoint", *checkpoint, "Checkpoint directory or run directory")->required();
  cmd->add_option("--out", *out, "Output directory (model.safetensors + config.json)")->required();
  cmd->callback([checkpoint, out]() {
    const auto opened = open_checkpoint(*checkpoint, print_checkpoint_warning);
    const CheckpointReader& ckpt = *opened;
    export_hugging_face(ckpt, *out);
    fmt::print("exported {} (step {}) to {}/model.safetensors and config.json\n", ckpt.dir(),
               ckpt.info().step, *out);
  });
}

}  // namespace shardlm::cli
