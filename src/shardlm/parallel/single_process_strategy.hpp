// The world-size-1 strategy: the rank owns every unit whole; parameters are the fp32
// master weights themselves and no hook communicates.
#pragma once

#include <vector>

#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/parallel/strategy.hpp"

namespace shardlm {

class SingleProcessStrategy final : public Strategy {
 public:
  explicit SingleProcessStrategy(const ParamLayout& layout,
                                 MemoryTracker& tracker = MemoryTracker::global());

  std::string name() const override { return "single"; }
  int world_size() const override { return 1; }
  int rank() const override { return 0; }
  UnitPointers params() override { return param_ptrs_; }
  UnitPointers grads() override { return grad_ptrs_; }
  OwnedSlice owned(int unit) override;

  void begin_step(int num_micro_batches) override;
  void before_forward(int) override {}
  void after_forward(int) override {}
  void before_backward(int) override {}
  void after_backward(int, int) override {}
  void finish_gradients() override {}
  double global_grad_norm_squared() override;
  void after_step() override {}
  void after_load() override {}

 private:
  const ParamLayout& layout_;
  std::vector<TrackedBuffer> params_, grads_, adam_m_, adam_v_;
  std::vector<float*> param_ptrs_, grad_ptrs_;
};

}  // namespace shardlm
