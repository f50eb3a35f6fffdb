#include "shardlm/train/train_options.hpp"

#include <nlohmann/json.hpp>

namespace shardlm {

nlohmann::json TrainOptions::trajectory_json() const {
  nlohmann::json j = {{"seq_len", seq_len},     {"global_batch", global_batch},
                      {"lr", lr},               {"min_lr", min_lr.value_or(lr / 10.0f)},
                      {"warmup", warmup},       {"weight_decay", weight_decay},
                      {"grad_clip", grad_clip}, {"beta1", beta1},
                      {"beta2", beta2},         {"seed", seed},
                      {"precision", precision}, {"reduce_dtype", reduce_dtype}};
  if (precision == "fp16") {
    j["loss_scale"] = loss_scale;
    j["loss_scale_growth_interval"] = loss_scale_growth_interval;
  }
  return j;
}

}  // namespace shardlm
