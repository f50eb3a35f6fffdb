#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/cli/commands.hpp"

namespace shardlm::cli {

void register_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "inspect", "Print a checkpoint's config, step, tensors and weights digest");
  cmd->add_option("path", *path, "A checkpoint directory, or a run directory (its latest)")
      ->required();
  cmd->callback([path]() {
    CheckpointReader ckpt(resolve_checkpoint_path(*path));
    const auto& info = ckpt.info();
    fmt::print("checkpoint: {}\n", ckpt.dir());
    fmt::print("model: {}\n", info.model.to_json().dump());
    fmt::print("tokenizer: {}\n", info.tokenizer);
    fmt::print("step: {}\ntokens_seen: {}\n", info.step, info.tokens_seen);
    fmt::print("written by: strategy {} at world size {}\n", info.strategy, info.world_size);
    int64_t total = 0;
    for (const auto& [name, shape] : ckpt.tensors()) {
      int64_t numel = 1;
      for (auto d : shape) numel *= d;
      total += numel;
      fmt::print("  {:<48} [{}]\n", name, fmt::join(shape, ", "));
    }
    fmt::print("tensors: {}, elements: {}\n", ckpt.tensors().size(), total);
    fmt::print("digest: {}\n", ckpt.weights_digest());
  });
}

}  // namespace shardlm::cli
