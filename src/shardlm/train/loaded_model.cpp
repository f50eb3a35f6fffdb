#include "shardlm/train/loaded_model.hpp"

#include <cmath>

#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/parallel/owned_params.hpp"

namespace shardlm {

LoadedModel::LoadedModel(const CheckpointReader& checkpoint, int max_batch, int max_seq,
                         const std::string& use, const ModelOptions& options)
    : layout_(ParamLayout::build(checkpoint.info().model, 1)),
      model_(model_family(checkpoint.info().model.family)
                 .make_model(checkpoint.info().model, layout_, max_batch, max_seq, options,
                             MemoryTracker::global())),
      strategy_(layout_, model_->unit_needs(), comm_, StrategyOptions{}),
      runner_(*model_, strategy_) {
  checkpoint.load_into(layout_, strategy_);
  check_finite(fmt::format("checkpoint '{}'", checkpoint.dir()), use);
}

LoadedModel::LoadedModel(const std::string& hf_dir, const ModelConfig& config, int max_batch,
                         int max_seq, const std::string& use, const ModelOptions& options)
    : layout_(ParamLayout::build(config, 1)),
      model_(model_family(config.family)
                 .make_model(config, layout_, max_batch, max_seq, options,
                             MemoryTracker::global())),
      strategy_(layout_, model_->unit_needs(), comm_, StrategyOptions{}),
      runner_(*model_, strategy_) {
  import_hugging_face(hf_dir, config, layout_, strategy_);  // refuses non-finite values itself
  check_finite(fmt::format("model '{}'", hf_dir), use);
}

void LoadedModel::check_finite(const std::string& source, const std::string& use) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const auto& unit = layout_.units[static_cast<size_t>(u)];
    if (unit.raw) continue;  // quantized words, not values
    int64_t bad = -1;
    for_each_owned_params(strategy_.owned(u), [&](int64_t first, int64_t n, const float* values) {
      for (int64_t i = 0; i < n && bad < 0; ++i)
        if (!std::isfinite(values[i])) bad = first + i;
    });
    if (bad < 0) continue;
    std::string tensor = unit.name;
    for (const auto& p : unit.params)
      if (bad >= p.offset && bad < p.offset + p.numel) tensor = p.name;
    throw Error(fmt::format("{} tensor '{}' holds non-finite values (NaN or infinity); refusing "
                            "to {} it",
                            source, tensor, use));
  }
}

}  // namespace shardlm
