// OwnedState: the rank's owned part of every unit, as the code that reads and writes
// it from outside the step sees it: checkpoints (save and load), Hugging Face import,
// initialisation, the optimizer, the finite check and the host's copy of a device's
// state (parallel/host_owned_state.hpp). None of them needs the step hooks
// (parallel/strategy.hpp), so none of them takes a Strategy.
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

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

class OwnedState {
 public:
  virtual ~OwnedState() = default;
  virtual OwnedSlice owned(int unit) = 0;
  // After master slices were initialised or loaded: make what depends on them (the
  // parameters the model reads, a device's copy) consistent.
  virtual void after_load() = 0;
  // Whether this rank writes its owned slices into checkpoints (replicas do not).
  virtual bool writes_checkpoint() const { return true; }
  // Which units' owned parts it writes (ddp with expert parallelism: each expert by
  // the first rank that holds it, the dense units by rank 0).
  virtual bool writes_unit(int unit) const {
    (void)unit;
    return true;
  }
};

}  // namespace shardlm
