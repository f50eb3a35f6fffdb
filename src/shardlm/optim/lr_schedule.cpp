#include "shardlm/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace shardlm {

float LrSchedule::at(int64_t step) const {
  if (step < warmup_steps)
    return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  int64_t decay_steps = total_steps - 1 - warmup_steps;
  if (decay_steps <= 0) return max_lr;
  double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps);
  progress = std::clamp(progress, 0.0, 1.0);
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + (max_lr - min_lr) * cosine);
}

}  // namespace shardlm
