#include "shardlm/parallel/single_process_strategy.hpp"

#include <cstring>

#include "shardlm/optim/adamw.hpp"

namespace shardlm {

SingleProcessStrategy::SingleProcessStrategy(const ParamLayout& layout, MemoryTracker& tracker)
    : layout_(layout) {
  for (const auto& unit : layout.units) {
    const size_t bytes = static_cast<size_t>(unit.padded_numel) * sizeof(float);
    params_.emplace_back(MemCategory::params, bytes, tracker);
    grads_.emplace_back(MemCategory::grads, bytes, tracker);
    adam_m_.emplace_back(MemCategory::optimizer, bytes, tracker);
    adam_v_.emplace_back(MemCategory::optimizer, bytes, tracker);
    param_ptrs_.push_back(params_.back().as<float>());
    grad_ptrs_.push_back(grads_.back().as<float>());
  }
}

OwnedSlice SingleProcessStrategy::owned(int unit) {
  const auto u = static_cast<size_t>(unit);
  return {0, layout_.units[u].padded_numel, params_[u].as<float>(), grads_[u].as<float>(),
          adam_m_[u].as<float>(), adam_v_[u].as<float>()};
}

void SingleProcessStrategy::begin_step(int) {
  for (auto& g : grads_) std::memset(g.data(), 0, g.bytes());
}

double SingleProcessStrategy::global_grad_norm_squared() {
  double total = 0.0;
  for (size_t u = 0; u < grads_.size(); ++u)
    total += sum_of_squares(grads_[u].as<float>(), layout_.units[u].padded_numel);
  return total;
}

}  // namespace shardlm
