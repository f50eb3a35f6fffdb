// A checkpoint's model ready to run in this process (sample, eval): layout, model
// sized for (max_batch, max_seq), a world-size-1 strategy holding the weights, and
// the runner that goes through the strategy's hooks.
#pragma once

#include <memory>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

class LoadedModel {
 public:
  LoadedModel(const CheckpointReader& checkpoint, int max_batch, int max_seq);
  ModelRunner& runner() { return runner_; }
  Model& model() { return *model_; }

 private:
  ParamLayout layout_;
  std::unique_ptr<Model> model_;
  SingleProcessCommunicator comm_;
  FlatUnitStrategy strategy_;
  ModelRunner runner_;
};

}  // namespace shardlm
