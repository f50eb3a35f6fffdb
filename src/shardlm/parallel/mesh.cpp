#include "shardlm/parallel/mesh.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

// The name messages and counters know a group by. A partition (shard and the
// dimensions it spans beyond it: expert, context) is named by shard and those of its
// other dimensions that have more than one rank, so without them it is the "shard
// group", as it was before they existed.
std::string group_name(MeshDims dims, const MeshShape& shape) {
  if (dims == MeshDims{MeshDim::replicate}) return "replica group";
  if (dims == MeshShape::data_parallel()) return "data-parallel group";
  if (dims.contains(MeshDim::shard) && !dims.contains(MeshDim::replicate)) {
    std::string name = "shard";
    for (MeshDim d : {MeshDim::expert, MeshDim::context, MeshDim::tensor, MeshDim::pipeline})
      if (dims.contains(d) && shape.size(d) > 1) name += std::string(" x ") + mesh_dim_name(d);
    return name + " group";
  }
  return dims.to_string() + " group";
}

}  // namespace

DeviceMesh::DeviceMesh(const MeshShape& shape, Communicator& world,
                       const std::vector<MeshDims>& groups)
    : shape_(shape), world_(world) {
  shape_.check_world(world.size());
  for (const MeshDims& dims : groups) {
    SHARDLM_CHECK(std::none_of(groups_.begin(), groups_.end(),
                               [&](const Group& g) { return g.dims == dims; }),
                  "internal: the mesh's {} asked for twice", group_name(dims, shape_));
    Group g{dims, &world_, nullptr};
    if (shape_.size(dims) != world.size()) {
      g.owned = world.split(shape_.group_index(world.rank(), dims),
                            shape_.rank_in_group(world.rank(), dims), group_name(dims, shape_));
      g.comm = g.owned.get();
    }
    groups_.push_back(std::move(g));
  }
}

DeviceMesh::~DeviceMesh() {
  // Sub-communicators go before the world, the last split first.
  while (!groups_.empty()) groups_.pop_back();
}

Communicator& DeviceMesh::group(MeshDims dims) {
  for (auto& g : groups_)
    if (g.dims == dims) return *g.comm;
  throw Error(fmt::format("internal: the mesh has no {} (it was not asked for when it was built)",
                          group_name(dims, shape_)));
}

CommCounters DeviceMesh::take_group_counters() {
  CommCounters total;
  for (auto& g : groups_)
    if (g.owned) total += g.owned->take_counters();
  return total;
}

}  // namespace shardlm
