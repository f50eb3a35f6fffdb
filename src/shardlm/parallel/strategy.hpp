// Strategy: how the model's state is spread over ranks, expressed as the hooks of
// the step loop (docs/architecture.md "The step"). The model never asks which strategy
// runs; it uses the pointers a Strategy hands it. The owned state (what the optimizer,
// checkpoints and initialisation read and write) is the other interface a strategy
// implements, OwnedState (parallel/owned_state.hpp).
#pragma once

#include <string>

#include "shardlm/model/model.hpp"

namespace shardlm {

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  virtual int world_size() const = 0;
  virtual int rank() const = 0;

  // Full-unit buffers the model reads (params: fp32, or the compute type where the
  // strategy gathers parameters so) and accumulates into (grads, fp32). An entry is
  // valid between the before_* and after_* hooks of the units that need it.
  virtual ParamPointers params() = 0;
  virtual UnitPointers grads() = 0;

  // Step loop hooks (docs/architecture.md "The step"). micro_batch counts from 0 to num_micro_batches-1.
  virtual void begin_step(int num_micro_batches) = 0;
  // training: a backward of the same micro-batch follows (gradients are needed).
  virtual void before_forward(int unit, bool training) = 0;
  virtual void after_forward(int unit) = 0;
  virtual void before_backward(int unit) = 0;
  virtual void after_backward(int unit, int micro_batch) = 0;
  virtual void finish_gradients() = 0;
  // Sum over all ranks of the squared reduced gradient (the global norm squared).
  virtual double global_grad_norm_squared() = 0;
  // After the optimizer updated the owned master slices (and their compute_copy, where
  // the slice has one): make params consistent.
  virtual void after_step() = 0;
  // Waits for every collective still in flight (end of run, before a checkpoint).
  virtual void synchronize() {}
};

}  // namespace shardlm
