// The shape of the device mesh: the job's ranks laid out on named dimensions.
//
// Dimensions come in one fixed order, outermost first: replicate, shard, expert,
// context, tensor, pipeline. A rank's coordinates are its index in row-major order
// (the last dimension varies fastest), so ranks that differ only in an inner
// dimension are neighbours: hybrid's shard groups are runs of consecutive ranks,
// which `launch` places on one node; so are context groups (under tensor ranks), as
// Megatron places context parallelism inside expert and data parallelism (and the
// data-parallel ranks of a dense unit's partition come in the same order with and
// without an expert dimension). Today's strategies use two dimensions:
//   ddp, zero1, zero2, zero3   shard=N (ddp too: its all-reduce is a reduce-scatter and an
//                              all-gather over the same partition as zero's, which keeps the
//                              strategies bitwise equal; what is replicated is the strategy's
//                              business, not the mesh's)
//   hybrid                     replicate=N/G x shard=G
// The data-parallel ranks (which rows a rank reads) are replicate x shard x expert;
// context and tensor read the same rows on every rank of their group.
//
// MeshShape is the layout arithmetic alone (no communicator: `plan`, the sampler and
// tests use it); DeviceMesh (mesh.hpp) adds the sub-communicators over a world.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

enum class MeshDim { replicate, shard, expert, context, tensor, pipeline };
inline constexpr int kMeshDims = 6;
const char* mesh_dim_name(MeshDim dim);

// A set of dimensions: the group of ranks that differ only in these coordinates.
class MeshDims {
 public:
  MeshDims(std::initializer_list<MeshDim> dims);
  bool contains(MeshDim dim) const { return (bits_ >> static_cast<int>(dim)) & 1u; }
  bool operator==(const MeshDims&) const = default;
  // "shard", "replicate x shard".
  std::string to_string() const;

 private:
  unsigned bits_ = 0;
};

class MeshShape {
 public:
  MeshShape() { sizes_.fill(1); }  // one rank
  // "replicate=2,shard=4": names from the list above, outermost first, each at most
  // once, sizes >= 1; dimensions left out have size 1. Error naming the spec and what
  // was expected otherwise.
  static MeshShape parse(const std::string& spec);
  // replicate=world/group x shard=group. Error (naming --shard-group-size) when
  // `group` does not divide the world.
  static MeshShape replicated_shards(int world_size, int group);

  int size(MeshDim dim) const { return sizes_[static_cast<size_t>(dim)]; }
  void set_size(MeshDim dim, int size);
  int world_size() const;  // the product of the sizes
  int size(MeshDims dims) const;
  // Error "--mesh replicate=2,shard=4 lays out 8 ranks (2 x 4), the job has 6" when
  // the product is not the job's world size.
  void check_world(int world_size) const;

  // Row-major, outermost first; coordinates() has kMeshDims entries.
  std::vector<int> coordinates(int rank) const;
  int coordinate(int rank, MeshDim dim) const;
  int rank_of(const std::vector<int>& coordinates) const;
  // The ranks of `dims`' group that holds `rank`, ascending (which is also the order
  // of their coordinates in those dimensions).
  std::vector<int> group_ranks(int rank, MeshDims dims) const;
  // `rank`'s place in that group, and which group it is (0 .. world / group size - 1,
  // numbering the other dimensions' coordinates row-major): a split's key and color.
  int rank_in_group(int rank, MeshDims dims) const;
  int group_index(int rank, MeshDims dims) const;

  // Data parallelism: ranks that read different rows (replicate x shard x expert: the
  // expert dimension is carved out of data parallelism, as Megatron's expert
  // parallelism is; its ranks hold different experts and exchange tokens).
  static MeshDims data_parallel() { return {MeshDim::replicate, MeshDim::shard, MeshDim::expert}; }
  int data_parallel_size() const { return size(data_parallel()); }
  int data_parallel_rank(int rank) const { return rank_in_group(rank, data_parallel()); }

  // Expert parallelism: the ranks that hold different experts and exchange tokens. The
  // expert dimension alone, or, when expert_spans_context(), expert x context: an expert
  // group larger than the data-parallel ranks borrows the context ranks (which read the
  // same rows and route their own tokens), as Megatron-core folds the attention's data x
  // context ranks into expert x expert-data. The sizes alone cannot say which (N=4, P=2:
  // expert=2,context=2 is E=2 or E=4), hence the marker.
  bool expert_spans_context() const { return expert_spans_context_; }
  void set_expert_spans_context(bool spans) { expert_spans_context_ = spans; }
  MeshDims expert_group() const;
  int expert_parallel_size() const { return size(expert_group()); }
  // `rank`'s place in its expert group: which slice of the experts it holds.
  int expert_rank(int rank) const { return rank_in_group(rank, expert_group()); }

  // "replicate=2,shard=4": replicate and shard always, the others when larger than 1,
  // and ",expert_group=expert+context" last when the expert group spans the context
  // ranks; parse(to_string()) gives the shape back.
  std::string to_string() const;
  // {"replicate": 2, "shard": 4}, the same dimensions as to_string() (and
  // "expert_group": "expert+context" when it spans the context ranks).
  nlohmann::json to_json() const;
  // The inverse of to_json() (dimensions left out have size 1); Error on an unknown
  // name or a size below 1.
  static MeshShape from_json(const nlohmann::json& j);
  bool operator==(const MeshShape&) const = default;

 private:
  std::array<int, kMeshDims> sizes_{};
  bool expert_spans_context_ = false;
};

}  // namespace shardlm
