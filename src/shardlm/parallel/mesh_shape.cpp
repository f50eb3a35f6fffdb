#include "shardlm/parallel/mesh_shape.hpp"

#include <algorithm>
#include <charconv>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

constexpr std::array<MeshDim, kMeshDims> kAllDims = {MeshDim::replicate, MeshDim::shard,
                                                     MeshDim::expert,    MeshDim::context,
                                                     MeshDim::tensor,    MeshDim::pipeline};
constexpr const char* kDimList = "replicate, shard, expert, context, tensor, pipeline";
// The marker after the dimensions: which dimensions the expert group spans.
constexpr const char* kExpertGroupKey = "expert_group";
constexpr const char* kExpertGroupSpanning = "expert+context";

// The marker's value: "expert+context" spans the context ranks, "expert" (the default)
// does not; Error naming `where` otherwise, or when there is no context dimension to span.
bool expert_group_spans_context(const std::string& value, int context_size, const std::string& where) {
  SHARDLM_CHECK(value == kExpertGroupSpanning || value == "expert",
                "{}: {}={} is not an expert group (expected expert or expert+context)", where,
                kExpertGroupKey, value);
  const bool spans = value == kExpertGroupSpanning;
  SHARDLM_CHECK(!spans || context_size > 1,
                "{}: {}=expert+context needs a context dimension larger than 1", where,
                kExpertGroupKey);
  return spans;
}

}  // namespace

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::replicate: return "replicate";
    case MeshDim::shard: return "shard";
    case MeshDim::context: return "context";
    case MeshDim::expert: return "expert";
    case MeshDim::tensor: return "tensor";
    case MeshDim::pipeline: return "pipeline";
  }
  return "?";
}

MeshDims::MeshDims(std::initializer_list<MeshDim> dims) {
  for (MeshDim d : dims) bits_ |= 1u << static_cast<int>(d);
}

std::string MeshDims::to_string() const {
  std::string s;
  for (MeshDim d : kAllDims)
    if (contains(d)) s += (s.empty() ? "" : " x ") + std::string(mesh_dim_name(d));
  return s.empty() ? "no dimension" : s;
}

MeshShape MeshShape::parse(const std::string& spec) {
  MeshShape shape;
  int next = 0;  // dimensions before this one are behind us
  size_t start = 0;
  SHARDLM_CHECK(!spec.empty(), "--mesh is empty (expected NAME=SIZE,... outermost first, e.g. "
                "replicate=2,shard=4)");
  std::string expert_group;  // the marker's value, when given (last)
  while (start <= spec.size()) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string item = spec.substr(start, comma - start);
    const size_t eq = item.find('=');
    SHARDLM_CHECK(eq != std::string::npos && eq > 0,
                  "--mesh '{}': '{}' is not NAME=SIZE (expected e.g. replicate=2,shard=4; names: {})",
                  spec, item, kDimList);
    const std::string name = item.substr(0, eq);
    SHARDLM_CHECK(expert_group.empty(), "--mesh '{}': '{}' comes after {} (it goes last)", spec,
                  item, kExpertGroupKey);
    if (name == kExpertGroupKey) {
      expert_group = item.substr(eq + 1);
      SHARDLM_CHECK(!expert_group.empty(), "--mesh '{}': {}= is empty (expected expert or "
                    "expert+context)", spec, kExpertGroupKey);
      start = comma + 1;
      continue;
    }
    int found = -1;
    for (int d = 0; d < kMeshDims; ++d)
      if (name == mesh_dim_name(kAllDims[static_cast<size_t>(d)])) found = d;
    SHARDLM_CHECK(found >= 0, "--mesh '{}': unknown dimension '{}' (expected {})", spec, name,
                  kDimList);
    SHARDLM_CHECK(found >= next,
                  "--mesh '{}': '{}' comes {} (dimensions go outermost first, each once: {})", spec,
                  name, found + 1 == next ? "twice" : "out of order", kDimList);
    const std::string digits = item.substr(eq + 1);
    int size = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), size);
    SHARDLM_CHECK(error == std::errc() && end == digits.data() + digits.size() && size >= 1,
                  "--mesh '{}': the size of {} must be a whole number >= 1, got '{}'", spec, name,
                  digits);
    shape.sizes_[static_cast<size_t>(found)] = size;
    next = found + 1;
    start = comma + 1;
  }
  if (!expert_group.empty())
    shape.expert_spans_context_ = expert_group_spans_context(
        expert_group, shape.size(MeshDim::context), fmt::format("--mesh '{}'", spec));
  return shape;
}

MeshShape MeshShape::replicated_shards(int world_size, int group) {
  SHARDLM_CHECK(group >= 1 && group <= world_size && world_size % group == 0,
                "--shard-group-size {} must divide the world size {} (hybrid shards inside "
                "groups of that many ranks)",
                group, world_size);
  MeshShape shape;
  shape.set_size(MeshDim::replicate, world_size / group);
  shape.set_size(MeshDim::shard, group);
  return shape;
}

void MeshShape::set_size(MeshDim dim, int size) {
  SHARDLM_CHECK(size >= 1, "internal: mesh dimension {} of size {}", mesh_dim_name(dim), size);
  sizes_[static_cast<size_t>(dim)] = size;
}

int MeshShape::world_size() const {
  int n = 1;
  for (int s : sizes_) n *= s;
  return n;
}

MeshDims MeshShape::expert_group() const {
  if (expert_spans_context_) return {MeshDim::expert, MeshDim::context};
  return {MeshDim::expert};
}

int MeshShape::size(MeshDims dims) const {
  int n = 1;
  for (MeshDim d : kAllDims)
    if (dims.contains(d)) n *= size(d);
  return n;
}

void MeshShape::check_world(int world_size) const {
  if (this->world_size() == world_size) return;
  std::string product;
  for (MeshDim d : kAllDims)
    if (size(d) > 1) product += (product.empty() ? "" : " x ") + std::to_string(size(d));
  throw Error(fmt::format("--mesh {} lays out {} rank(s) ({}), the job has {}", to_string(),
                          this->world_size(), product.empty() ? "1" : product, world_size));
}

std::vector<int> MeshShape::coordinates(int rank) const {
  SHARDLM_CHECK(rank >= 0 && rank < world_size(), "internal: rank {} outside a mesh of {} ranks",
                rank, world_size());
  std::vector<int> c(kMeshDims, 0);
  for (int d = kMeshDims - 1; d >= 0; --d) {
    const int s = sizes_[static_cast<size_t>(d)];
    c[static_cast<size_t>(d)] = rank % s;
    rank /= s;
  }
  return c;
}

int MeshShape::coordinate(int rank, MeshDim dim) const {
  return coordinates(rank)[static_cast<size_t>(dim)];
}

int MeshShape::rank_of(const std::vector<int>& coordinates) const {
  SHARDLM_CHECK(coordinates.size() == static_cast<size_t>(kMeshDims),
                "internal: {} mesh coordinates, expected {}", coordinates.size(), kMeshDims);
  int rank = 0;
  for (size_t d = 0; d < coordinates.size(); ++d) {
    SHARDLM_CHECK(coordinates[d] >= 0 && coordinates[d] < sizes_[d],
                  "internal: {} coordinate {} outside 0..{}", mesh_dim_name(kAllDims[d]),
                  coordinates[d], sizes_[d] - 1);
    rank = rank * sizes_[d] + coordinates[d];
  }
  return rank;
}

std::vector<int> MeshShape::group_ranks(int rank, MeshDims dims) const {
  const std::vector<int> fixed = coordinates(rank);
  std::vector<int> ranks;
  for (int r = 0; r < world_size(); ++r) {
    const std::vector<int> c = coordinates(r);
    bool same = true;
    for (size_t d = 0; d < c.size(); ++d)
      if (!dims.contains(kAllDims[d]) && c[d] != fixed[d]) same = false;
    if (same) ranks.push_back(r);
  }
  return ranks;
}

int MeshShape::rank_in_group(int rank, MeshDims dims) const {
  const std::vector<int> c = coordinates(rank);
  int index = 0;
  for (size_t d = 0; d < c.size(); ++d)
    if (dims.contains(kAllDims[d])) index = index * sizes_[d] + c[d];
  return index;
}

int MeshShape::group_index(int rank, MeshDims dims) const {
  const std::vector<int> c = coordinates(rank);
  int index = 0;
  for (size_t d = 0; d < c.size(); ++d)
    if (!dims.contains(kAllDims[d])) index = index * sizes_[d] + c[d];
  return index;
}

std::string MeshShape::to_string() const {
  std::string s;
  for (MeshDim d : kAllDims)
    if (d == MeshDim::replicate || d == MeshDim::shard || size(d) > 1)
      s += fmt::format("{}{}={}", s.empty() ? "" : ",", mesh_dim_name(d), size(d));
  if (expert_spans_context_) s += fmt::format(",{}={}", kExpertGroupKey, kExpertGroupSpanning);
  return s;
}

nlohmann::json MeshShape::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (MeshDim d : kAllDims)
    if (d == MeshDim::replicate || d == MeshDim::shard || size(d) > 1) j[mesh_dim_name(d)] = size(d);
  if (expert_spans_context_) j[kExpertGroupKey] = kExpertGroupSpanning;
  return j;
}

MeshShape MeshShape::from_json(const nlohmann::json& j) {
  SHARDLM_CHECK(j.is_object(), "a mesh must be an object of dimension sizes, got {}", j.dump());
  MeshShape shape;
  for (const auto& [name, size] : j.items()) {
    if (name == kExpertGroupKey) continue;  // read below, once the context size is known
    bool known = false;
    for (MeshDim d : kAllDims)
      if (name == mesh_dim_name(d)) {
        SHARDLM_CHECK(size.is_number_integer() && size.get<int>() >= 1,
                      "mesh {}: the size of {} must be a whole number >= 1", j.dump(), name);
        shape.set_size(d, size.get<int>());
        known = true;
      }
    SHARDLM_CHECK(known, "mesh {}: unknown dimension '{}' (expected {})", j.dump(), name, kDimList);
  }
  if (const auto it = j.find(kExpertGroupKey); it != j.end()) {
    SHARDLM_CHECK(it->is_string(), "mesh {}: {} must be a string", j.dump(), kExpertGroupKey);
    shape.expert_spans_context_ = expert_group_spans_context(
        it->get<std::string>(), shape.size(MeshDim::context), fmt::format("mesh {}", j.dump()));
  }
  return shape;
}

}  // namespace shardlm
