#include "shardlm/parallel/placed_mesh.hpp"

#include "shardlm/comm/device_communicator.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

namespace shardlm {

namespace {

constexpr MeshDim kModelParallelDims[] = {MeshDim::context, MeshDim::expert, MeshDim::tensor};

}  // namespace

std::vector<MeshDims> run_mesh_groups(const MeshShape& shape) {
  std::vector<MeshDims> groups = FlatUnitStrategy::mesh_groups(shape);
  for (MeshDim dim : kModelParallelDims)
    if (shape.size(dim) > 1) groups.push_back({dim});
  return groups;
}

ModelParallelGroups model_parallel_groups(DeviceMesh& mesh) {
  auto group = [&](MeshDim dim) -> Communicator* {
    return mesh.shape().size(dim) > 1 ? &mesh.group({dim}) : nullptr;
  };
  return {group(MeshDim::context), group(MeshDim::tensor), group(MeshDim::expert)};
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
