// HostGradients: where a strategy whose optimizer lives in host memory (--offload
// optimizer) sends the reduced gradients. As backward completes a unit, the strategy
// reduces it on the device and hands over the reduced elements of its owned slice
// (device memory); the host copies them into a staging slice and adds them, in fp32,
// to its accumulation of the step (ZeRO-Offload's gradient path); the global norm is
// then taken over those host slices. HostOwnedState implements it.
#pragma once

#include <cstdint>

namespace shardlm {

class HostGradients {
 public:
  virtual ~HostGradients() = default;
  // Start of a step: every unit's accumulated gradient is zero.
  virtual void zero() = 0;
  // Adds the n reduced elements at `reduced` (device memory, the whole owned slice of
  // flat unit `unit`) to its accumulated gradient.
  virtual void accumulate(int unit, const float* reduced, int64_t n) = 0;
  // Sum of squares (double) of n accumulated elements of the unit from element
  // `offset` of its owned slice: what this rank adds to the global norm.
  virtual double sum_of_squares(int unit, int64_t offset, int64_t n) = 0;
};

}  // namespace shardlm
