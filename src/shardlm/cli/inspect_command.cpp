#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/checkpoint_values.hpp"
#include "shardlm/cli/commands.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/parallel/mesh_shape.hpp"

namespace shardlm::cli {

namespace {

struct InspectArgs {
  std::string path;
  std::string compare;
  double tolerance = 0.0;
  std::string relative_to = "tensor";
  bool quiet = false;
};

// Largest |a - b| relative to the largest |b| of the same tensor ("tensor"), or of
// the whole model ("model"); Error when it exceeds the tolerance. Per tensor is the
// strict measure: a tensor whose exact gradient is zero (e.g. the attention key
// bias, to which softmax is invariant) receives pure rounding noise that Adam turns
// into lr-sized steps, so runs that sum in another order differ there most.
void compare_checkpoints(const CheckpointReader& a, const CheckpointReader& b, double tolerance,
                         const std::string& relative_to) {
  SHARDLM_CHECK(relative_to == "tensor" || relative_to == "model" || relative_to == "norm",
                "--relative-to must be tensor, model or norm, got '{}'", relative_to);
  SHARDLM_CHECK(a.tensors() == b.tensors(),
                "'{}' and '{}' hold different tensors (names or shapes differ)", a.dir(), b.dir());
  double worst = 0.0, model_diff = 0.0, model_mag = 0.0, diff_sq = 0.0, weight_sq = 0.0;
  std::string worst_name;
  // The values as each run computes with them: a QLoRA base's NF4 words dequantized.
  const ParamLayout layout_a = ParamLayout::build(a.info().model, 1);
  const ParamLayout layout_b = ParamLayout::build(b.info().model, 1);
  for (const auto& [name, shape] : a.tensors()) {
    const std::vector<float> va = read_tensor_values(a, *layout_a.find(name).second);
    const std::vector<float> vb = read_tensor_values(b, *layout_b.find(name).second);
    double max_diff = 0.0, max_mag = 0.0;
    for (size_t i = 0; i < va.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(va[i]) - vb[i]));
      max_mag = std::max(max_mag, std::fabs(static_cast<double>(vb[i])));
      const double d = static_cast<double>(va[i]) - vb[i];
      diff_sq += d * d;
      weight_sq += static_cast<double>(vb[i]) * vb[i];
    }
    model_diff = std::max(model_diff, max_diff);
    model_mag = std::max(model_mag, max_mag);
    const double relative = max_mag > 0 ? max_diff / max_mag : max_diff;
    if (relative > worst || worst_name.empty()) {
      worst = relative;
      worst_name = name;
    }
  }
  const double model_relative = model_mag > 0 ? model_diff / model_mag : model_diff;
  fmt::print("max relative difference per tensor: {:.3e} (tensor {})\n", worst, worst_name);
  const double norm_relative = weight_sq > 0 ? std::sqrt(diff_sq / weight_sq) : std::sqrt(diff_sq);
  fmt::print("max relative difference over the model: {:.3e}\n", model_relative);
  fmt::print("relative difference of the weight vector (L2): {:.3e}\n", norm_relative);
  const double measured = relative_to == "tensor"  ? worst
                          : relative_to == "model" ? model_relative
                                                   : norm_relative;
  SHARDLM_CHECK(measured <= tolerance,
                "weights differ by {:.3e} relative to the {} (worst tensor {}), more than the "
                "tolerance {:.3e}",
                measured, relative_to, worst_name, tolerance);
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand(
      "inspect", "Print a checkpoint's config, step, tensors and weights digest");
  cmd->add_option("path", args->path, "A checkpoint directory, or a run directory (its latest)")
      ->required();
  cmd->add_option("--compare", args->compare,
                  "Another checkpoint: print the largest per-tensor relative weight difference "
                  "and fail if it exceeds --tolerance");
  cmd->add_option("--tolerance", args->tolerance, "For --compare (default 0: bitwise)")
      ->capture_default_str();
  cmd->add_option("--relative-to", args->relative_to,
                  "For --compare: max |difference| relative to each tensor's largest weight "
                  "(tensor), to the model's largest weight (model), or the L2 norm of the "
                  "difference relative to the weights' (norm)")
      ->capture_default_str();
  cmd->add_flag("--quiet", args->quiet, "Only the digest line (and the comparison)");
  cmd->callback([args]() {
    const auto opened = open_checkpoint(args->path, print_checkpoint_warning);
    const CheckpointReader& ckpt = *opened;
    if (!args->compare.empty()) {
      const auto other = open_checkpoint(args->compare, print_checkpoint_warning);
      compare_checkpoints(ckpt, *other, args->tolerance, args->relative_to);
      return;
    }
    if (args->quiet) {
      fmt::print("digest: {}\noptimizer digest: {}\n", ckpt.weights_digest(),
                 ckpt.optimizer_digest());
      return;
    }
    const auto& info = ckpt.info();
    fmt::print("checkpoint: {}\n", ckpt.dir());
    fmt::print("model: {}\n", info.model.to_json().dump());
    fmt::print("tokenizer: {}\n", info.tokenizer);
    fmt::print("step: {}\ntokens_seen: {}\n", info.step, info.tokens_seen);
    // The mesh is recorded for information (older checkpoints have none): a
    // checkpoint loads under any mesh.
    const std::string mesh =
        info.train.contains("mesh") ? " (mesh " + MeshShape::from_json(info.train.at("mesh")).to_string() + ")" : "";
    fmt::print("written by: strategy {} at world size {}{}\n", info.strategy, info.world_size, mesh);
    int64_t total = 0;
    for (const auto& [name, shape] : ckpt.tensors()) {
      int64_t numel = 1;
      for (auto d : shape) numel *= d;
      total += numel;
      fmt::print("  {:<48} [{}]\n", name, fmt::join(shape, ", "));
    }
    fmt::print("tensors: {}, elements: {}\n", ckpt.tensors().size(), total);
    fmt::print("digest: {}\n", ckpt.weights_digest());
    fmt::print("optimizer digest: {}\n", ckpt.optimizer_digest());
  });
}

}  // namespace shardlm::cli
