// all_finite: whether floats hold no NaN or infinity, in one branch-free pass (cheap
// enough to run over a model's state before every checkpoint and export).
#pragma once

#include <cstdint>
#include <cstring>

namespace shardlm {

inline bool all_finite(const float* values, int64_t n) {
  // An exponent of all ones is an infinity or a NaN.
  uint32_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof(bits));
    non_finite |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return non_finite == 0;
}

}  // namespace shardlm
