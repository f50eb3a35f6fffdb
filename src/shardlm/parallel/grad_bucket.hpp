// GradBucket: a ddp/zero1 gradient bucket: flat units whose full gradients are
// reduced together once the last of them (in backward order) is complete, as PyTorch
// DDP's buckets and Megatron's bucket groups (FlatUnitStrategy::plan_buckets decides
// which units). One object per bucket holds the bucket's collectives in flight, so a
// device backend can order them with one event.
#pragma once

#include <vector>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/parallel/flat_unit.hpp"

namespace shardlm {

class GradBucket {
 public:
  // units: flat unit indices in launch (backward) order; not empty.
  explicit GradBucket(std::vector<int> units);

  const std::vector<int>& units() const { return units_; }
  // The unit whose complete gradient launches the bucket.
  int last_unit() const { return units_.back(); }

  // Reduce-scatters each unit's full gradient in place, and with all_gather_after
  // (ddp's all-reduce, as reduce-scatter + all-gather over the same partition as the
  // sharded strategies, so all of them sum each element the same way) gathers the
  // summed slices back. flat_units: indexed by unit.
  void start_reduce(std::vector<FlatUnit>& flat_units, Communicator& shard, WireType wire,
                    bool all_gather_after);
  // Waits for all of them.
  void finish_reduce();
  bool started() const { return !works_.empty(); }
  // Collectives started and not yet done.
  int pending() const;

 private:
  std::vector<int> units_;
  std::vector<Work> works_;  // in launch order
};

}  // namespace shardlm
