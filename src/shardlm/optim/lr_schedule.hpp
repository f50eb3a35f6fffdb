// Learning-rate schedule: linear warmup, then cosine decay to min_lr.
#pragma once

#include <cstdint>

namespace shardlm {

struct LrSchedule {
  float max_lr = 6e-4f;
  float min_lr = 6e-5f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // lr for 0-based step: (step+1)/warmup * max_lr during warmup, then cosine from
  // max_lr (at step == warmup) to min_lr (at step == total_steps - 1).
  float at(int64_t step) const;
};

}  // namespace shardlm
