// PlacedStrategy: the run's strategy where its buffers live (--device). On the host
// the FlatUnitStrategy is its own owned state. On a device it talks over the groups of
// the PlacedMesh (split from the device's communicator), and a HostOwnedState keeps the
// owned state in host memory: a
// mirror for checkpoints, initialisation and import, or, with --offload optimizer,
// the truth (AdamW runs there). The trainer drives the step through strategy() and
// reads and writes state through owned_state(), and never asks where it runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/parallel/host_owned_state.hpp"
#include "shardlm/parallel/mesh.hpp"
#include "shardlm/parallel/strategy_options.hpp"

namespace shardlm {

class PlacedStrategy {
 public:
  // Collective over the mesh's world. layout is built for the mesh's shard size;
  // unit_needs as FlatUnitStrategy takes them; `mesh` is the run's PlacedMesh's (on
  // `device`); `backend` is the device's (backend_for(device)). layout and mesh must
  // outlive this.
  PlacedStrategy(const ParamLayout& layout, std::vector<std::vector<int>> unit_needs,
                 DeviceMesh& mesh, const StrategyOptions& options, Device device,
                 Backend& backend);
  ~PlacedStrategy();

  Strategy& strategy() { return *strategy_; }
  // What host code reads and writes (checkpoints, init, import, the finite check).
  OwnedState& owned_state();
  // The strategy's own owned slices, where its buffers live: what the optimizer
  // updates (with the optimizer offloaded, their ranges only).
  OwnedState& strategy_state() { return *strategy_; }
  // --offload optimizer: the host state AdamW runs on; else null.
  HostOwnedState* offloaded_optimizer();
  // Before host code reads the owned state. On a device: every collective finished and
  // the host's mirror pulled. On the host nothing: the owned slices are the strategy's,
  // which no collective in flight writes.
  void stage_for_host();
  // Read and reset the counters of the mesh's groups split from the world.
  CommCounters take_group_counters() { return mesh_.take_group_counters(); }
  // The first 64 bits of sha256 over the replicated parameters (ddp, zero1, zero2;
  // nothing for sharded units), for --check-replicas.
  uint64_t replicated_params_digest();
  // "GEMM <library>" on the host; the device backend's description (and the offload) else.
  std::string describe() const;

 private:
  const ParamLayout& layout_;
  const Device device_;
  Backend& backend_;
  DeviceMesh& mesh_;
  std::unique_ptr<FlatUnitStrategy> strategy_;
  std::unique_ptr<HostOwnedState> host_state_;  // null on the host
};

}  // namespace shardlm
