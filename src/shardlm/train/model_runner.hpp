// ModelRunner: runs the model's units through a Strategy's hooks. Training,
// evaluation and sampling all go through it, so every strategy gathers, frees and
// reduces in exactly one place.
#pragma once

#include "shardlm/model/model.hpp"
#include "shardlm/parallel/strategy.hpp"

namespace shardlm {

class ModelRunner {
 public:
  ModelRunner(Model& model, Strategy& strategy) : model_(model), strategy_(strategy) {}

  // Forward of every unit; with targets, returns the loss sum over non-ignored targets.
  // `last_logits` [vocab], if given, receives the logits of the last position (see
  // forward_cached).
  double forward(const MicroBatch& batch, bool training, float grad_scale,
                 float* last_logits = nullptr);
  // Forward of every unit over the next batch.T tokens of one sequence with a KV cache
  // (Model::forward_unit_cached); `last_logits` [vocab] receives the logits of the last
  // of them (Model::logits_at), read while the final unit's parameters are still
  // gathered: a sharding strategy frees them in after_forward.
  void forward_cached(const MicroBatch& batch, KvCache& cache, float* last_logits);
  // Backward of every unit in reverse order; micro_batch tells the strategy where in
  // the accumulation the step is (DDP communicates on the last one only).
  void backward(const MicroBatch& batch, int micro_batch);

  Model& model() { return model_; }
  Strategy& strategy() { return strategy_; }

 private:
  Model& model_;
  Strategy& strategy_;
};

}  // namespace shardlm
