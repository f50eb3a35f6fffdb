#include "shardlm/optim/adamw.hpp"

#include <algorithm>

namespace shardlm {

std::vector<ElementRange> weight_decay_ranges(const UnitLayout& unit, int64_t slice_begin,
                                              int64_t slice_end) {
  std::vector<ElementRange> ranges;
  for (const auto& p : unit.params) {
    if (!p.weight_decay) continue;
    int64_t begin = std::max(p.offset, slice_begin);
    int64_t end = std::min(p.offset + p.numel, slice_end);
    if (begin < end) ranges.push_back({begin - slice_begin, end - slice_begin});
  }
  return ranges;
}

float clip_multiplier(double global_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = max_norm / (global_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace shardlm
