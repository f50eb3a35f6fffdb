// A checkpoint's model ready to run in this process (sample, chat, eval): layout, model
// sized for (max_batch, max_seq), a world-size-1 strategy holding the weights, and
// the runner that goes through the strategy's hooks. The weights are checked finite
// on load: a checkpoint holding a NaN or an infinity is refused, naming the tensor (as
// export refuses it), before anything runs.
#pragma once

#include <memory>
#include <string>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

class LoadedModel {
 public:
  // `use` says what the weights are for, in the refusal ("evaluate", "sample from").
  LoadedModel(const CheckpointReader& checkpoint, int max_batch, int max_seq,
              const std::string& use = "run", const ModelOptions& options = ModelOptions{});
  // A Hugging Face model directory (config.json and safetensors weights).
  LoadedModel(const std::string& hf_dir, const ModelConfig& config, int max_batch, int max_seq,
              const std::string& use = "run", const ModelOptions& options = ModelOptions{});
  ModelRunner& runner() { return runner_; }
  Model& model() { return *model_; }

 private:
  void check_finite(const std::string& source, const std::string& use);

  ParamLayout layout_;
  std::unique_ptr<Model> model_;
  SingleProcessCommunicator comm_;
  FlatUnitStrategy strategy_;
  ModelRunner runner_;
};

}  // namespace shardlm
