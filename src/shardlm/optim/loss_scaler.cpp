#include "shardlm/optim/loss_scaler.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"

namespace shardlm {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config), scale_(config.initial_scale) {
  SHARDLM_CHECK(config.initial_scale > 0 && config.growth_factor >= 1 &&
                    config.backoff_factor > 0 && config.backoff_factor < 1 &&
                    config.growth_interval > 0,
                "loss scaler: invalid configuration (scale {}, growth {}, backoff {}, interval {})",
                config.initial_scale, config.growth_factor, config.backoff_factor,
                config.growth_interval);
}

bool LossScaler::update(bool gradients_finite) {
  if (!gradients_finite) {
    scale_ = std::max(config_.min_scale, scale_ * config_.backoff_factor);
    good_steps_ = 0;
    ++skipped_steps_;
    return false;
  }
  if (++good_steps_ >= config_.growth_interval) {
    scale_ *= config_.growth_factor;
    good_steps_ = 0;
  }
  return true;
}

nlohmann::json LossScaler::to_json() const {
  return {{"scale", scale_}, {"good_steps", good_steps_}, {"skipped_steps", skipped_steps_}};
}

void LossScaler::load_json(const nlohmann::json& state) {
  try {
    scale_ = state.at("scale").get<double>();
    good_steps_ = state.at("good_steps").get<int64_t>();
    skipped_steps_ = state.at("skipped_steps").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("loss scaler state: {}", e.what()));
  }
}

}  // namespace shardlm
