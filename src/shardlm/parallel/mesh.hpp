// DeviceMesh: the sub-communicators of the groups the strategies talk over, for a
// world laid out as a MeshShape (mesh_shape.hpp says how ranks are placed). Outside
// comm/ (where the NCCL world copies its host world) nothing else splits one.
#pragma once

#include <memory>
#include <vector>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/parallel/mesh_shape.hpp"

namespace shardlm {

// The sub-communicators over a world laid out as `shape`. Collective over `world`
// (every rank builds the same groups, in the same order). A group that spans the
// whole world is the world itself; every other group asked for is split once here,
// named "<dims> group" ("shard group", "replica group" for replicate) so that
// messages and counters say which group waited. The mesh must outlive the users of
// its groups and be destroyed before `world`.
class DeviceMesh {
 public:
  DeviceMesh(const MeshShape& shape, Communicator& world, const std::vector<MeshDims>& groups);
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  const MeshShape& shape() const { return shape_; }
  Communicator& world() { return world_; }
  int rank() const { return world_.rank(); }
  int coordinate(MeshDim dim) const { return shape_.coordinate(rank(), dim); }
  // A group asked for at construction; error naming it otherwise.
  Communicator& group(MeshDims dims);
  // Read and reset the counters of the groups split here (the world's are its own).
  CommCounters take_group_counters();

 private:
  struct Group {
    MeshDims dims;
    Communicator* comm;                  // world_ or owned
    std::unique_ptr<Communicator> owned;
  };
  const MeshShape shape_;
  Communicator& world_;
  std::vector<Group> groups_;
};

}  // namespace shardlm
