// HostOwnedState: the owned state (fp32 master weights, AdamW m and v) of a strategy
// whose buffers live on a device, held in host memory. It is an OwnedState itself:
// owned() hands out the host slices, so checkpoints, Hugging Face import,
// initialisation and the finite check read and write it with no device case of their
// own; the step's hooks stay the device strategy's.
//
// Two roles (--offload optimizer or not):
// - mirror: the device holds the truth; pull() copies it here before a save or a
//   check, push() copies what was loaded or initialised here to the device.
// - offloaded optimizer (ZeRO-Offload): the host holds the truth for the master, m, v
//   and the step's gradient of every trainable unit; the device keeps only the
//   parameters in the compute type (parallel/flat_unit_strategy.hpp). As HostGradients
//   it receives each reduced gradient slice from the device, copies it into a staging
//   slice and accumulates it in fp32; step() runs the CPU backend's AdamW on the
//   master, rounds it into the compute type (the staging slice) and copies that to the
//   device's parameters, unit by unit.
// Host bytes by the host tracker's category (StrategyBufferPlan::host_*, which `plan`
// reports): params (master, 4 per owned trainable element), optimizer (m, v: 8),
// frozen (frozen weights as the device stores them) and, offloaded, grads (the fp32
// accumulation, 4, plus the staging slice of the largest owned trainable slice).
#pragma once

#include <span>
#include <vector>

#include "shardlm/backend/adamw_config.hpp"
#include "shardlm/backend/backend.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/host_gradients.hpp"
#include "shardlm/parallel/owned_state.hpp"

namespace shardlm {

class HostOwnedState final : public OwnedState, public HostGradients {
 public:
  enum class Role { mirror, offloaded_optimizer };
  // `host`: where the host's slices live and its kernels (accumulation, AdamW,
  // rounding) run: the CPU backend, or for `plan` a meta backend standing for the host.
  HostOwnedState(const ParamLayout& layout, OwnedState& device_state, Backend& device,
                 Role role, Backend& host = cpu_backend());

  Role role() const { return role_; }
  // Device -> host (mirror: master, m, v; offloaded: the frozen weights only, the host
  // is the truth for the rest).
  void pull();
  // Host -> device: the parameters (offloaded: rounded into the compute type the device
  // stores) and, mirrored, m and v; then the device state's after_load() rebuilds
  // what depends on them.
  void push();
  // Offloaded optimizer: one AdamW step of every trainable owned slice (see above).
  void step(std::span<const std::vector<ElementRange>> decay_ranges, float lr,
            float grad_multiplier, int64_t step, const AdamWConfig& config);

  // HostGradients (offloaded optimizer).
  void zero() override;
  void accumulate(int unit, const float* reduced, int64_t n) override;
  double sum_of_squares(int unit, int64_t offset, int64_t n) override;

  // OwnedState: the host slices (mirrored, grad is the device's, which host code never
  // reads; offloaded, the host's accumulated gradient).
  OwnedSlice owned(int unit) override;
  // Master (and mirrored state) changed here: push() it, then the device rebuilds
  // what depends on it.
  void after_load() override {
    push();
    device_.after_load();
  }
  bool writes_checkpoint() const override { return device_.writes_checkpoint(); }
  bool writes_unit(int unit) const override { return device_.writes_unit(unit); }

 private:
  struct HostSlice {
    // master: the parameters, fp32 (trainable) or as the device stores them
    // (stored_type: a frozen unit's compute type or raw words).
    TrackedBuffer master, m, v, grad;  // grad: offloaded only
    DType stored_type = DType::fp32;
    bool offloaded = false;  // the host is the truth (a trainable unit, offloaded)
  };
  static void* device_params(const OwnedSlice& s);  // master, or the stored parameters
  // Offloaded: the host master rounded into the device's type and copied there.
  void send_params(const OwnedSlice& device_slice, const HostSlice& h);
  HostSlice& slice(int unit);
  OwnedState& device_;  // the device strategy's
  Backend& backend_;
  Backend& host_;
  const Role role_;
  std::vector<HostSlice> slices_;
  // Offloaded: one slice of the largest owned trainable unit (gradients coming in,
  // rounded parameters going out).
  TrackedBuffer staging_;
};

}  // namespace shardlm
