#include "shardlm/parallel/placed_mesh.hpp"

#include "shardlm/comm/device_communicator.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

namespace shardlm {

namespace {

// The model's groups: context, expert (the expert dimension, or expert x context when
// the expert group spans the context ranks), tensor.
std::vector<MeshDims> model_parallel_dims(const MeshShape& shape) {
  return {{MeshDim::context}, shape.expert_group(), {MeshDim::tensor}};
}

}  // namespace

std::vector<MeshDims> run_mesh_groups(const MeshShape& shape) {
  std::vector<MeshDims> groups = FlatUnitStrategy::mesh_groups(shape);
  for (const MeshDims& dims : model_parallel_dims(shape))
    if (shape.size(dims) > 1) groups.push_back(dims);
  return groups;
}

ModelParallelGroups model_parallel_groups(DeviceMesh& mesh) {
  auto group = [&](MeshDims dims) -> Communicator* {
    return mesh.shape().size(dims) > 1 ? &mesh.group(dims) : nullptr;
  };
  return {group({MeshDim::context}), group({MeshDim::tensor}), group(mesh.shape().expert_group())};
}

PlacedMesh::PlacedMesh(const MeshShape& shape, Device device, Communicator& world) {
  device_comm_ = make_device_communicator(device, world);
  mesh_ = std::make_unique<DeviceMesh>(shape, device_comm_ ? *device_comm_ : world,
                                       run_mesh_groups(shape));
}

PlacedMesh::~PlacedMesh() {
  mesh_.reset();  // the groups go before the communicator they were split from
}

}  // namespace shardlm
