// AdamWOptimizer: one AdamW step over every owned slice an OwnedState hands out (the
// fp32 master weights, reduced gradient and moments of this rank's part of each unit),
// with weight decay only where the layout's parameters ask for it.
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/optim/adamw.hpp"
#include "shardlm/parallel/host_owned_state.hpp"
#include "shardlm/parallel/owned_state.hpp"

namespace shardlm {

class AdamWOptimizer {
 public:
  // The owned slices must not move afterwards (they do not: strategies allocate
  // once). The update runs on `backend` (where the strategy keeps the owned slices), or, with
  // `offloaded`, on the host through it (--offload optimizer).
  AdamWOptimizer(const ParamLayout& layout, OwnedState& state, const AdamWConfig& config,
                 Backend& backend = cpu_backend(), HostOwnedState* offloaded = nullptr);

  // step is AdamW's 1-based step count (bias correction); the gradient is multiplied
  // by grad_multiplier first (clipping, loss-scale removal).
  void step(float lr, float grad_multiplier, int64_t step);

 private:
  OwnedState& state_;
  Backend& backend_;
  HostOwnedState* offloaded_;
  AdamWConfig config_;
  std::vector<std::vector<ElementRange>> decay_ranges_;  // per unit, relative to the slice
};

}  // namespace shardlm
