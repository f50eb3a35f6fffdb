// Dynamic loss scaling for fp16 training (the PyTorch GradScaler / Megatron rule):
// multiply the loss by `scale` so small gradients survive fp16; a step whose
// gradients hold inf/NaN is skipped and the scale backs off; after `growth_interval`
// good steps in a row the scale grows.
#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

struct LossScalerConfig {
  double initial_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  double min_scale = 1.0;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config = {});

  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t good_steps() const { return good_steps_; }

  // After the gradients of a step are known (globally): returns true when the
  // optimizer may step (all gradients finite), false when the step must be skipped.
  bool update(bool gradients_finite);

  nlohmann::json to_json() const;  // for checkpoints
  void load_json(const nlohmann::json& state);

 private:
  LossScalerConfig config_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace shardlm
