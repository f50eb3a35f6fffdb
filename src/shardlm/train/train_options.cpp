#include "shardlm/train/train_options.hpp"

#include <nlohmann/json.hpp>

namespace shardlm {

nlohmann::json TrainOptions::trajectory_json() const {
  return {{"seq_len", seq_len},     {"global_batch", global_batch},
          {"lr", lr},               {"min_lr", min_lr.value_or(lr / 10.0f)},
          {"warmup", warmup},       {"weight_decay", weight_decay},
          {"grad_clip", grad_clip}, {"beta1", beta1},
          {"beta2", beta2},         {"seed", seed}};
}

}  // namespace shardlm
