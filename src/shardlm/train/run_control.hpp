// What every rank must decide alike at the start of a step, though it is known to some
// ranks only: stop (a signal reached one rank, or all of them at different steps) and
// save now (rank 0's clock says --save-every-minutes have passed). Both ride in the
// step's target-count all-reduce, so they cost no collective (and no deadline) of their
// own: each rank adds its flags above its target count, and the sum carries
//   bits 0..39   target tokens of the step (all ranks)
//   bits 40..60  ranks asking to stop
//   bit  61      save now (rank 0 only)
#pragma once

#include <cstdint>

namespace shardlm {

struct RunControl {
  bool stop = false;      // some rank received a stop signal
  bool save_now = false;  // rank 0's save clock ran out
};

inline constexpr int kTargetCountBits = 40;
inline constexpr int kStopCountBits = 21;

// This rank's term of the sum over `world_size` ranks; Error when the world's target
// count could overflow its field.
int64_t pack_target_count(int64_t target_count, const RunControl& local, int world_size);

struct UnpackedTargetCount {
  int64_t target_count = 0;
  RunControl control;
};
// The all-reduced sum back into the step's target count and the agreed flags.
UnpackedTargetCount unpack_target_count(int64_t sum);

}  // namespace shardlm
