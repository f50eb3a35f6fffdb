// The arguments of the backends' AdamW (Backend::adamw_update; the CPU kernel is
// backend/cpu/adamw.hpp): its hyperparameters, and the element ranges it decays
// (which ranges: the optimizer's weight_decay_ranges, optim/adamw.hpp).
#pragma once

#include <cstdint>

namespace shardlm {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// A half-open element range [begin, end) relative to the start of a slice.
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
};

}  // namespace shardlm
