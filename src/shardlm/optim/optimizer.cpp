#include "shardlm/optim/optimizer.hpp"

namespace shardlm {

AdamWOptimizer::AdamWOptimizer(const ParamLayout& layout, OwnedState& state,
                               const AdamWConfig& config, Backend& backend,
                               HostOwnedState* offloaded)
    : state_(state), backend_(backend), offloaded_(offloaded), config_(config) {
  for (int u = 0; u < layout.num_units(); ++u) {
    const OwnedSlice s = state_.owned(u);
    decay_ranges_.push_back(
        weight_decay_ranges(layout.units[static_cast<size_t>(u)], s.begin, s.end));
  }
}

void AdamWOptimizer::step(float lr, float grad_multiplier, int64_t step) {
  if (offloaded_ != nullptr) {
    offloaded_->step(decay_ranges_, lr, grad_multiplier, step, config_);
    return;
  }
  for (size_t u = 0; u < decay_ranges_.size(); ++u) {
    const OwnedSlice s = state_.owned(static_cast<int>(u));
    if (s.grad == nullptr) continue;  // a frozen unit (LoRA's base) does not train
    backend_.adamw_update(s.master, s.grad, s.adam_m, s.adam_v, s.size(), decay_ranges_[u], lr,
                 grad_multiplier, step, config_, s.compute_copy);
  }
}

}  // namespace shardlm
