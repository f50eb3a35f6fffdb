#include "shardlm/train/loaded_model.hpp"

namespace shardlm {

std::vector<std::vector<int>> model_unit_needs(const Gpt2Model& model) {
  std::vector<std::vector<int>> needs;
  for (int m = 0; m < model.num_units(); ++m) needs.push_back(model.units_needed_for(m));
  return needs;
}

LoadedModel::LoadedModel(const CheckpointReader& checkpoint, int max_batch, int max_seq)
    : layout_(ParamLayout::build(checkpoint.info().model, 1)),
      model_(checkpoint.info().model, layout_, max_batch, max_seq),
      strategy_(layout_, model_unit_needs(model_), comm_, StrategyOptions{}),
      runner_(model_, strategy_) {
  checkpoint.load_into(layout_, strategy_);
}

}  // namespace shardlm
