// Strategy: how the model's state is spread over ranks, expressed as the hooks of
// the step loop (docs/architecture.md "The step"). The model and the optimizer never ask which
// strategy runs; they use the pointers and slices a Strategy hands them.
#pragma once

#include <cstdint>
#include <string>

#include "shardlm/core/dtype.hpp"
#include "shardlm/model/model.hpp"

namespace shardlm {

// The rank's owned part of one unit: elements [begin, end) of the unit's flat
// buffer, with its fp32 master weights, reduced gradient and AdamW moments.
// compute_copy, where set, is the same elements of the compute-type copy of the
// parameters the model reads (ddp in a bf16 run): the optimizer writes it along with
// master (after_step then trusts it); anything else that changes master calls
// after_load, which rebuilds it.
//
// Where a strategy keeps no fp32 master, the parameters are stored once, in the type
// the model reads (`stored`, the same elements), and master is null: a frozen unit of
// a bf16 or fp16 run (not raw), and, on a device with --offload optimizer, every
// trainable unit (the master is the host's, parallel/host_owned_state.hpp; grad, adam_m
// and adam_v are null there too). Code that loads or saves parameters goes through
// parallel/owned_params.hpp, which serves both.
struct OwnedSlice {
  int64_t begin = 0;
  int64_t end = 0;
  float* master = nullptr;
  float* grad = nullptr;
  float* adam_m = nullptr;
  float* adam_v = nullptr;
  TypedPtr compute_copy;
  TypedPtr stored;  // the parameters where there is no fp32 master (then master is null)
  int64_t size() const { return end - begin; }
};

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
  virtual OwnedSlice owned(int unit) = 0;

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
  // After master slices were initialised or loaded: make params consistent.
  virtual void after_load() = 0;
  // Waits for every collective still in flight (end of run, before a checkpoint).
  virtual void synchronize() {}
  // Whether this rank writes its owned slices into checkpoints (replicas do not).
  virtual bool writes_checkpoint() const { return true; }
};

}  // namespace shardlm
