// PlacedMesh: the run's device mesh where its collectives run (--device). On the host
// the mesh's groups are split from the world communicator; on a device from the
// device's communicator (NCCL, or the emulated device's), which the world carries the
// host's values beside. It is built before the model: the model's own computation
// talks over its model-parallel groups (ModelParallelGroups, model/model.hpp), the
// strategy over the data groups (FlatUnitStrategy::mesh_groups).
#pragma once

#include <memory>
#include <vector>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/device.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/parallel/mesh.hpp"

namespace shardlm {

// The groups a run's mesh splits, in the order DeviceMesh splits them: the
// strategy's (FlatUnitStrategy::mesh_groups), then each model-parallel dimension
// (context, expert, tensor) of more than one rank. `plan`'s traced step builds the
// same list over its recording communicator.
std::vector<MeshDims> run_mesh_groups(const MeshShape& shape);

// The model-parallel groups of `mesh` (built with run_mesh_groups' list): null for a
// dimension of one rank.
ModelParallelGroups model_parallel_groups(DeviceMesh& mesh);

class PlacedMesh {
 public:
  // Collective over `world`. world must outlive this.
  PlacedMesh(const MeshShape& shape, Device device, Communicator& world);
  ~PlacedMesh();
  PlacedMesh(const PlacedMesh&) = delete;
  PlacedMesh& operator=(const PlacedMesh&) = delete;

  DeviceMesh& mesh() { return *mesh_; }
  ModelParallelGroups model_groups() { return model_parallel_groups(*mesh_); }

 private:
  std::unique_ptr<Communicator> device_comm_;  // null on the host
  std::unique_ptr<DeviceMesh> mesh_;           // over device_comm_ when there is one
};

}  // namespace shardlm
