// HostOwnedState: the owned state (fp32 master weights, AdamW m and v) of a strategy
// whose buffers live on a device, held in host memory. It is a Strategy itself:
// owned() hands out the host slices and every other call goes to the device's
// strategy, so checkpoints, Hugging Face import, initialisation and the finite check
// read and write it with no device case of their own.
//
// Two roles (--offload optimizer or not):
// - mirror: the device holds the truth; pull() copies it here before a save or a
//   check, push() copies what was loaded or initialised here to the device.
// - offloaded optimizer (ZeRO-Offload): the host holds the truth for master, m and
//   v (the device keeps no AdamW state); step() brings each owned gradient slice to
//   the host, runs the CPU backend's AdamW there and sends the updated master back to
//   the device's owned parameters (and their compute copy), unit by unit. Host bytes:
//   16 per owned trainable element (master, m, v, gradient staging), the "optimizer"
//   category of the host's tracker (RunPlan::host_optimizer).
#pragma once

#include <span>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/optim/adamw.hpp"
#include "shardlm/parallel/strategy.hpp"

namespace shardlm {

class HostOwnedState final : public Strategy {
 public:
  enum class Role { mirror, offloaded_optimizer };
  HostOwnedState(const ParamLayout& layout, Strategy& device_strategy, Backend& device,
                 Role role);

  Role role() const { return role_; }
  // Device -> host (mirror: master, m, v; offloaded: nothing, the host is the truth).
  void pull();
  // Host -> device: master (and, mirrored, m and v); then the device strategy's
  // after_load() rebuilds what depends on master.
  void push();
  // Offloaded optimizer: one AdamW step of every trainable owned slice (see above).
  void step(std::span<const std::vector<ElementRange>> decay_ranges, float lr,
            float grad_multiplier, int64_t step, const AdamWConfig& config);

  std::string name() const override { return device_.name(); }
  int world_size() const override { return device_.world_size(); }
  int rank() const override { return device_.rank(); }
  ParamPointers params() override { return device_.params(); }
  UnitPointers grads() override { return device_.grads(); }
  // The host slices (grad: the device's, which host code never reads).
  OwnedSlice owned(int unit) override;
  void begin_step(int num_micro_batches) override { device_.begin_step(num_micro_batches); }
  void before_forward(int unit, bool training) override { device_.before_forward(unit, training); }
  void after_forward(int unit) override { device_.after_forward(unit); }
  void before_backward(int unit) override { device_.before_backward(unit); }
  void after_backward(int unit, int micro_batch) override {
    device_.after_backward(unit, micro_batch);
  }
  void finish_gradients() override { device_.finish_gradients(); }
  double global_grad_norm_squared() override { return device_.global_grad_norm_squared(); }
  void after_step() override { device_.after_step(); }
  // Master (and mirrored state) changed here: push() it, then the device rebuilds
  // what depends on it.
  void after_load() override {
    push();
    device_.after_load();
  }
  void synchronize() override { device_.synchronize(); }
  bool writes_checkpoint() const override { return device_.writes_checkpoint(); }

 private:
  struct HostSlice {
    // master: the parameters as the device stores them (stored_type: fp32, or the
    // compute type of a frozen unit, OwnedSlice::frozen).
    TrackedBuffer master, m, v, grad;  // grad: offloaded only
    DType stored_type = DType::fp32;
  };
  static void* stored_params(const OwnedSlice& s);  // master, or frozen's storage
  Strategy& device_;
  Backend& backend_;
  const Role role_;
  std::vector<HostSlice> slices_;
};

}  // namespace shardlm
