#include "shardlm/parallel/strategy_options.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

StrategyKind parse_strategy_kind(const std::string& name) {
  if (name == "ddp") return StrategyKind::ddp;
  if (name == "zero1") return StrategyKind::zero1;
  if (name == "zero2" || name == "shard_grad_op") return StrategyKind::zero2;
  if (name == "zero3" || name == "fsdp" || name == "full_shard") return StrategyKind::zero3;
  if (name == "hybrid" || name == "hybrid_shard") return StrategyKind::hybrid;
  throw Error(fmt::format(
      "unknown strategy '{}' (expected ddp, zero1, zero2|shard_grad_op, zero3|fsdp|full_shard "
      "or hybrid)",
      name));
}

std::string to_string(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::ddp: return "ddp";
    case StrategyKind::zero1: return "zero1";
    case StrategyKind::zero2: return "zero2";
    case StrategyKind::zero3: return "zero3";
    case StrategyKind::hybrid: return "hybrid";
  }
  return "?";
}

MeshShape strategy_mesh(const StrategyOptions& options, int world_size) {
  if (options.kind == StrategyKind::hybrid)
    return MeshShape::replicated_shards(world_size, options.shard_group_size);
  return MeshShape::replicated_shards(world_size, world_size);
}

int partition_size(const StrategyOptions& options, int world_size) {
  return strategy_mesh(options, world_size).size(MeshDim::shard);
}

}  // namespace shardlm
