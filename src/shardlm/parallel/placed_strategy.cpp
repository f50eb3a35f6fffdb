#include "shardlm/parallel/placed_strategy.hpp"

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/core/sha256.hpp"

namespace shardlm {

PlacedStrategy::PlacedStrategy(const ParamLayout& layout, std::vector<std::vector<int>> unit_needs,
                               DeviceMesh& mesh, const StrategyOptions& options, Device device,
                               Backend& backend)
    : layout_(layout), device_(device), backend_(backend), mesh_(mesh) {
  strategy_ = std::make_unique<FlatUnitStrategy>(layout, std::move(unit_needs), mesh_, options,
                                                 MemoryTracker::global(), backend);
  if (!device.is_host())
    host_state_ = std::make_unique<HostOwnedState>(
        layout, *strategy_, backend,
        options.optimizer_on_host ? HostOwnedState::Role::offloaded_optimizer
                                  : HostOwnedState::Role::mirror);
  if (options.optimizer_on_host) strategy_->accumulate_gradients_on(*host_state_);
}

PlacedStrategy::~PlacedStrategy() = default;

OwnedState& PlacedStrategy::owned_state() {
  return host_state_ ? static_cast<OwnedState&>(*host_state_) : *strategy_;
}

HostOwnedState* PlacedStrategy::offloaded_optimizer() {
  return host_state_ && host_state_->role() == HostOwnedState::Role::offloaded_optimizer
             ? host_state_.get()
             : nullptr;
}

void PlacedStrategy::stage_for_host() {
  if (!host_state_) return;
  strategy_->synchronize();
  host_state_->pull();
}

uint64_t PlacedStrategy::replicated_params_digest() {
  Sha256 hasher;
  std::vector<float> host;
  for (int u = 0; u < layout_.num_units(); ++u)
    if (const float* params = strategy_->replicated_params(u)) {
      host.resize(static_cast<size_t>(layout_.units[static_cast<size_t>(u)].padded_numel));
      backend_.copy_to_host(host.data(), params, host.size() * sizeof(float));
      hasher.update(host.data(), host.size() * sizeof(float));
    }
  return std::stoull(hasher.hex_digest().substr(0, 16), nullptr, 16);
}

std::string PlacedStrategy::describe() const {
  if (device_.is_host()) return std::string("GEMM ") + cpu::gemm_library_name();
  return backend_.description() +
         (host_state_ && host_state_->role() == HostOwnedState::Role::offloaded_optimizer
              ? "; optimizer offloaded to host memory"
              : "");
}

}  // namespace shardlm
