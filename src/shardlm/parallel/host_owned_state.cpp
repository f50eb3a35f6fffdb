#include "shardlm/parallel/host_owned_state.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

HostOwnedState::HostOwnedState(const ParamLayout& layout, Strategy& device_strategy,
                               Backend& device, Role role)
    : device_(device_strategy), backend_(device), role_(role) {
  const MemCategory category =
      role == Role::offloaded_optimizer ? MemCategory::optimizer : MemCategory::other;
  for (int u = 0; u < layout.num_units(); ++u) {
    const OwnedSlice s = device_.owned(u);
    const size_t bytes = sizeof(float) * static_cast<size_t>(s.size());
    HostSlice h;
    h.stored_type = s.master != nullptr ? DType::fp32 : s.frozen.dtype;
    // The parameters as the device stores them (a frozen unit of a bf16/fp16 run: in
    // the compute type).
    const size_t param_bytes = dtype_bytes(h.stored_type) * static_cast<size_t>(s.size());
    const bool trains = layout.units[static_cast<size_t>(u)].trainable;
    // A frozen unit has a master (its weights) and no optimizer state; offloading
    // leaves it on the device, where the model reads it.
    if (role == Role::mirror) {
      h.master = TrackedBuffer(MemCategory::other, param_bytes);
      if (s.adam_m != nullptr) h.m = TrackedBuffer(category, bytes);
      if (s.adam_v != nullptr) h.v = TrackedBuffer(category, bytes);
    } else if (trains) {
      SHARDLM_CHECK(s.adam_m == nullptr && s.adam_v == nullptr,
                    "offloaded optimizer: the device strategy still holds AdamW state of unit {}",
                    u);
      for (TrackedBuffer* b : {&h.master, &h.m, &h.v, &h.grad}) *b = TrackedBuffer(category, bytes);
    } else {
      h.master = TrackedBuffer(MemCategory::other, param_bytes);  // a mirror of the frozen weights
    }
    slices_.push_back(std::move(h));
  }
  // The host's master starts as the device's (whatever init ran there).
  for (size_t u = 0; u < slices_.size(); ++u) {
    const OwnedSlice s = device_.owned(static_cast<int>(u));
    backend_.copy_to_host(slices_[u].master.data(), stored_params(s), slices_[u].master.bytes());
  }
}

void* HostOwnedState::stored_params(const OwnedSlice& s) {
  return s.master != nullptr ? static_cast<void*>(s.master) : s.frozen.data;
}

OwnedSlice HostOwnedState::owned(int unit) {
  OwnedSlice s = device_.owned(unit);
  const HostSlice& h = slices_.at(static_cast<size_t>(unit));
  if (h.stored_type == DType::fp32) {
    s.master = h.master.as<float>();
  } else {
    s.frozen = TypedPtr(h.master.data(), h.stored_type);
  }
  s.adam_m = h.m.as<float>();
  s.adam_v = h.v.as<float>();
  s.compute_copy = TypedPtr();  // rebuilt on the device by after_load / step
  return s;
}

void HostOwnedState::pull() {
  for (size_t u = 0; u < slices_.size(); ++u) {
    const OwnedSlice s = device_.owned(static_cast<int>(u));
    HostSlice& h = slices_[u];
    const bool host_is_truth = role_ == Role::offloaded_optimizer && h.grad.data() != nullptr;
    if (host_is_truth) continue;
    backend_.copy_to_host(h.master.data(), stored_params(s), h.master.bytes());
    if (h.m.data() != nullptr) backend_.copy_to_host(h.m.data(), s.adam_m, h.m.bytes());
    if (h.v.data() != nullptr) backend_.copy_to_host(h.v.data(), s.adam_v, h.v.bytes());
  }
}

void HostOwnedState::push() {
  for (size_t u = 0; u < slices_.size(); ++u) {
    const OwnedSlice s = device_.owned(static_cast<int>(u));
    const HostSlice& h = slices_[u];
    backend_.copy_from_host(stored_params(s), h.master.data(), h.master.bytes());
    if (role_ == Role::mirror) {
      if (h.m.data() != nullptr) backend_.copy_from_host(s.adam_m, h.m.data(), h.m.bytes());
      if (h.v.data() != nullptr) backend_.copy_from_host(s.adam_v, h.v.data(), h.v.bytes());
    }
  }
  backend_.synchronize();
}

void HostOwnedState::step(std::span<const std::vector<ElementRange>> decay_ranges, float lr,
                          float grad_multiplier, int64_t step, const AdamWConfig& config) {
  SHARDLM_CHECK(role_ == Role::offloaded_optimizer,
                "HostOwnedState::step: the optimizer is not offloaded");
  Backend& host = cpu_backend();
  for (size_t u = 0; u < slices_.size(); ++u) {
    const OwnedSlice s = device_.owned(static_cast<int>(u));
    HostSlice& h = slices_[u];
    if (s.grad == nullptr || h.grad.data() == nullptr) continue;  // frozen
    backend_.copy_to_host(h.grad.data(), s.grad, h.grad.bytes());
    host.adamw_update(h.master.as<float>(), h.grad.as<float>(), h.m.as<float>(), h.v.as<float>(),
                      s.size(), decay_ranges[u], lr, grad_multiplier, step, config, TypedPtr());
    // The device's parameters and their compute copy follow the host's master, rounded
    // on the device as the strategy's own update would.
    backend_.copy_from_host(s.master, h.master.data(), h.master.bytes());
    if (s.compute_copy.data != nullptr) backend_.convert(s.compute_copy, s.master, s.size());
  }
}

}  // namespace shardlm
