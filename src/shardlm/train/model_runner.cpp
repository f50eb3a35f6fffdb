#include "shardlm/train/model_runner.hpp"

namespace shardlm {

double ModelRunner::forward(const MicroBatch& batch, bool training, float grad_scale,
                            float* last_logits) {
  for (int u = 0; u < model_.num_units(); ++u) {
    strategy_.before_forward(u, training);
    model_.forward_unit(u, strategy_.params(), strategy_.grads(), batch, training, grad_scale);
    if (last_logits != nullptr && u == model_.num_units() - 1)
      model_.logits_at(strategy_.params(), batch.T - 1, last_logits);
    strategy_.after_forward(u);
  }
  return batch.targets != nullptr ? model_.last_loss_sum() : 0.0;
}

void ModelRunner::forward_cached(const MicroBatch& batch, KvCache& cache, float* last_logits) {
  for (int u = 0; u < model_.num_units(); ++u) {
    strategy_.before_forward(u, /*training=*/false);
    model_.forward_unit_cached(u, strategy_.params(), cache, batch);
    if (u == model_.num_units() - 1) model_.logits_at(strategy_.params(), batch.T - 1, last_logits);
    strategy_.after_forward(u);
  }
}

void ModelRunner::backward(const MicroBatch& batch, int micro_batch) {
  for (int u = model_.num_units() - 1; u >= 0; --u) {
    strategy_.before_backward(u);
    model_.backward_unit(u, strategy_.params(), strategy_.grads(), batch);
    strategy_.after_backward(u, micro_batch);
  }
}

}  // namespace shardlm
