#include "shardlm/train/train_options.hpp"

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"

namespace shardlm {

ModelConfig resolve_model_config(const TrainOptions& o, int data_vocab_size) {
  ModelConfig config = model_preset(o.model);
  if (o.n_layer) config.n_layer = *o.n_layer;
  if (o.n_head) config.n_head = *o.n_head;
  if (o.n_embd) config.n_embd = *o.n_embd;
  config.vocab_size = o.vocab_size.value_or(data_vocab_size);
  config.validate();
  SHARDLM_CHECK(config.vocab_size >= data_vocab_size,
                "--vocab-size {} is smaller than the data's vocabulary ({} from meta.json)",
                config.vocab_size, data_vocab_size);
  return config;
}

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
