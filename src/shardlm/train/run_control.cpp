#include "shardlm/train/run_control.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {
constexpr int64_t kStopUnit = int64_t{1} << kTargetCountBits;
constexpr int64_t kSaveUnit = int64_t{1} << (kTargetCountBits + kStopCountBits);
}  // namespace

int64_t pack_target_count(int64_t target_count, const RunControl& local, int world_size) {
  SHARDLM_CHECK(world_size >= 1 && world_size < (int64_t{1} << kStopCountBits),
                "a world of {} ranks is more than a step's agreement can count (below 2^{})",
                world_size, kStopCountBits);
  // No carry out of the target field: every rank's share below 2^40 / world size.
  SHARDLM_CHECK(target_count >= 0 && target_count < kStopUnit / world_size,
                "a step of {} target tokens on each of {} ranks is more than the step's "
                "agreement can carry (2^{} in all)",
                target_count, world_size, kTargetCountBits);
  return target_count + (local.stop ? kStopUnit : 0) + (local.save_now ? kSaveUnit : 0);
}

UnpackedTargetCount unpack_target_count(int64_t sum) {
  SHARDLM_CHECK(sum >= 0 && sum < 2 * kSaveUnit,
                "internal: the step's target-count sum {} is out of range", sum);
  UnpackedTargetCount out;
  out.target_count = sum & (kStopUnit - 1);
  out.control.stop = ((sum >> kTargetCountBits) & ((int64_t{1} << kStopCountBits) - 1)) != 0;
  out.control.save_now = (sum & kSaveUnit) != 0;
  return out;
}

}  // namespace shardlm
