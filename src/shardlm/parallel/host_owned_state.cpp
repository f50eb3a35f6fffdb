#include "shardlm/parallel/host_owned_state.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"

namespace shardlm {

HostOwnedState::HostOwnedState(const ParamLayout& layout, OwnedState& device_state,
                               Backend& device, Role role, Backend& host)
    : device_(device_state), backend_(device), host_(host), role_(role) {
  const auto host_buffer = [&](MemCategory category, size_t bytes) {
    return allocate_on(host_, category, bytes);
  };
  size_t staging_bytes = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const OwnedSlice s = device_.owned(u);
    const size_t bytes = sizeof(float) * static_cast<size_t>(s.size());
    const bool trains = layout.units[static_cast<size_t>(u)].trainable;
    HostSlice h;
    h.offloaded = trains && role == Role::offloaded_optimizer;
    if (h.offloaded) {
      SHARDLM_CHECK(s.master == nullptr && s.adam_m == nullptr && s.adam_v == nullptr,
                    "offloaded optimizer: the device strategy still holds the master or AdamW "
                    "state of unit {}",
                    u);
      h.master = host_buffer(MemCategory::params, bytes);
      h.m = host_buffer(MemCategory::optimizer, bytes);
      h.v = host_buffer(MemCategory::optimizer, bytes);
      h.grad = host_buffer(MemCategory::grads, bytes);
      staging_bytes = std::max(staging_bytes, bytes);
    } else {
      // The parameters as the device stores them (a frozen unit of a bf16/fp16 run: in
      // the compute type), and, mirrored, the optimizer state the device holds.
      h.stored_type = s.master != nullptr ? DType::fp32 : s.stored.dtype;
      const size_t param_bytes = dtype_bytes(h.stored_type) * static_cast<size_t>(s.size());
      h.master = host_buffer(trains ? MemCategory::params : MemCategory::frozen, param_bytes);
      if (s.adam_m != nullptr) h.m = host_buffer(MemCategory::optimizer, bytes);
      if (s.adam_v != nullptr) h.v = host_buffer(MemCategory::optimizer, bytes);
    }
    slices_.push_back(std::move(h));
  }
  if (staging_bytes > 0) staging_ = host_buffer(MemCategory::grads, staging_bytes);
  // The host's copies start as the device's (whatever init ran there); an offloaded
  // master has no device copy (init or a load writes it here, then push()).
  pull();
}

HostOwnedState::HostSlice& HostOwnedState::slice(int unit) {
  return slices_.at(static_cast<size_t>(unit));
}

void* HostOwnedState::device_params(const OwnedSlice& s) {
  return s.master != nullptr ? static_cast<void*>(s.master) : s.stored.data;
}

OwnedSlice HostOwnedState::owned(int unit) {
  OwnedSlice s = device_.owned(unit);
  const HostSlice& h = slice(unit);
  if (h.offloaded || h.stored_type == DType::fp32) {
    s.master = h.master.as<float>();
    s.stored = TypedPtr();
  } else {
    s.stored = TypedPtr(h.master.data(), h.stored_type);
  }
  if (h.offloaded) s.grad = h.grad.as<float>();
  s.adam_m = h.m.as<float>();
  s.adam_v = h.v.as<float>();
  s.compute_copy = TypedPtr();  // rebuilt on the device by after_load / step
  return s;
}

void HostOwnedState::pull() {
  for (size_t u = 0; u < slices_.size(); ++u) {
    HostSlice& h = slices_[u];
    if (h.offloaded) continue;  // the host is the truth
    const OwnedSlice s = device_.owned(static_cast<int>(u));
    backend_.copy_to_host(h.master.data(), device_params(s), h.master.bytes());
    if (h.m.data() != nullptr) backend_.copy_to_host(h.m.data(), s.adam_m, h.m.bytes());
    if (h.v.data() != nullptr) backend_.copy_to_host(h.v.data(), s.adam_v, h.v.bytes());
  }
}

void HostOwnedState::send_params(const OwnedSlice& device_slice, const HostSlice& h) {
  // (An expert unit held on other ranks of the expert group owns nothing here.)
  if (device_slice.size() == 0) return;
  const TypedPtr stored = device_slice.stored;
  SHARDLM_ASSERT(stored.data != nullptr);
  // Rounded here as the device's strategy rounds its master without offload (the same
  // round-to-nearest-even conversion), so the model reads the same values.
  const TypedPtr rounded(staging_.data(), stored.dtype);
  host_.convert(rounded, h.master.as<float>(), device_slice.size());
  backend_.copy_from_host(stored.data, staging_.data(),
                          dtype_bytes(stored.dtype) * static_cast<size_t>(device_slice.size()));
}

void HostOwnedState::push() {
  for (size_t u = 0; u < slices_.size(); ++u) {
    const OwnedSlice s = device_.owned(static_cast<int>(u));
    const HostSlice& h = slices_[u];
    if (h.offloaded) {
      send_params(s, h);
      continue;
    }
    backend_.copy_from_host(device_params(s), h.master.data(), h.master.bytes());
    if (h.m.data() != nullptr) backend_.copy_from_host(s.adam_m, h.m.data(), h.m.bytes());
    if (h.v.data() != nullptr) backend_.copy_from_host(s.adam_v, h.v.data(), h.v.bytes());
  }
  backend_.synchronize();
}

void HostOwnedState::zero() {
  for (HostSlice& h : slices_)
    if (h.offloaded) host_.fill_zero(h.grad.data(), h.grad.bytes());
}

void HostOwnedState::accumulate(int unit, const float* reduced, int64_t n) {
  HostSlice& h = slice(unit);
  SHARDLM_CHECK(h.offloaded && static_cast<size_t>(n) * sizeof(float) == h.grad.bytes(),
                "internal: {} reduced gradient elements for unit {}, which owns {} on the host",
                n, unit, h.grad.bytes() / sizeof(float));
  backend_.copy_to_host(staging_.data(), reduced, h.grad.bytes());
  host_.accumulate(h.grad.as<float>(), staging_.as<float>(), n);
}

double HostOwnedState::sum_of_squares(int unit, int64_t offset, int64_t n) {
  HostSlice& h = slice(unit);
  SHARDLM_ASSERT(h.offloaded && offset >= 0 &&
                 static_cast<size_t>(offset + n) * sizeof(float) <= h.grad.bytes());
  return host_.sum_of_squares(h.grad.as<float>() + offset, n);
}

void HostOwnedState::step(std::span<const std::vector<ElementRange>> decay_ranges, float lr,
                          float grad_multiplier, int64_t step, const AdamWConfig& config) {
  SHARDLM_CHECK(role_ == Role::offloaded_optimizer,
                "HostOwnedState::step: the optimizer is not offloaded");
  for (size_t u = 0; u < slices_.size(); ++u) {
    HostSlice& h = slices_[u];
    if (!h.offloaded) continue;  // frozen
    const OwnedSlice s = device_.owned(static_cast<int>(u));
    host_.adamw_update(h.master.as<float>(), h.grad.as<float>(), h.m.as<float>(), h.v.as<float>(),
                      s.size(), decay_ranges[u], lr, grad_multiplier, step, config, TypedPtr());
    send_params(s, h);
  }
  backend_.synchronize();
}

}  // namespace shardlm
