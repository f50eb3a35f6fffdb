#include "shardlm/train/checkpoint_schedule.hpp"

#include <filesystem>

#include <fmt/format.h>

namespace shardlm {

std::string CheckpointSchedule::checkpoint_dir(int64_t step) const {
  return (std::filesystem::path(o_.out_dir) / "checkpoints" / fmt::format("step_{:08d}", step))
      .string();
}

}  // namespace shardlm
