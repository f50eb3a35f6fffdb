#include "shardlm/train/loaded_model.hpp"

#include "shardlm/model/family.hpp"

namespace shardlm {

LoadedModel::LoadedModel(const CheckpointReader& checkpoint, int max_batch, int max_seq)
    : layout_(ParamLayout::build(checkpoint.info().model, 1)),
      model_(model_family(checkpoint.info().model.family)
                 .make_model(checkpoint.info().model, layout_, max_batch, max_seq, ModelOptions{},
                             MemoryTracker::global())),
      strategy_(layout_, model_->unit_needs(), comm_, StrategyOptions{}),
      runner_(*model_, strategy_) {
  checkpoint.load_into(layout_, strategy_);
}

}  // namespace shardlm
