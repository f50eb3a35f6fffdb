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

namespace {

// The dimensions above the tensor one, over the world's ranks divided by T.
MeshShape data_and_context_mesh(const StrategyOptions& options, int world_size) {
  const int P = options.context_parallel;
  SHARDLM_CHECK(P >= 1 && world_size % P == 0,
                "--context-parallel {} must divide the world size {} (each sequence is split "
                "over that many ranks)",
                P, world_size);
  const int E = options.expert_parallel;
  const bool hybrid = options.kind == StrategyKind::hybrid;
  // Whether the expert group takes in the context ranks (expert x context).
  bool spans_context = false;
  if (E != 1) {
    SHARDLM_CHECK(E >= 1 && world_size % E == 0,
                  "--expert-parallel {} does not divide the job's {} ranks (expected a divisor "
                  "of {})", E, world_size, world_size);
    // The expert dimension is carved out of the data-parallel ranks (hybrid: of each
    // shard group's G, its ranks partition a dense unit as without experts, replicated
    // across the groups), outside the context one: a context group's ranks route their
    // own tokens to the experts' holders among the ranks at the same context coordinate.
    // An E those ranks cannot hold takes in the context ranks too (each routes its own
    // tokens over the larger group), as Megatron-core folds data x context into expert x
    // expert-data: E/P expert coordinates times the P context ones.
    const int G = options.shard_group_size;
    spans_context = (hybrid ? G : world_size / P) % E != 0;
    if (hybrid)
      SHARDLM_CHECK(!spans_context || (E % P == 0 && G * P % E == 0),
                    "--expert-parallel {} with --strategy hybrid: the experts spread over each "
                    "shard group's {} ranks (--shard-group-size), which {} does not divide{} "
                    "(expected a divisor of {}{})", E, G, E,
                    P > 1 ? fmt::format(", or over them and their {} context ranks, which needs "
                                        "a multiple of {} dividing {}", P, P, G * P)
                          : "",
                    G, P > 1 ? fmt::format(" or a multiple of {} dividing {}", P, G * P) : "");
    else
      SHARDLM_CHECK(!spans_context || E % P == 0,
                    "--expert-parallel {} with --context-parallel {}: the experts spread over "
                    "the {} data-parallel ranks (the job's {} / {}), which {} does not divide, "
                    "or over them and the context ranks, which needs a multiple of {} (expected "
                    "a divisor of {} or a multiple of {} dividing {})", E, P, world_size / P,
                    world_size, P, E, P, world_size / P, P, world_size);
  }
  const int data_ranks = world_size / P;
  const int expert_coordinates = spans_context ? E / P : E;
  MeshShape shape = MeshShape::replicated_shards(data_ranks, hybrid ? options.shard_group_size : data_ranks);
  shape.set_size(MeshDim::shard, shape.size(MeshDim::shard) / expert_coordinates);
  shape.set_size(MeshDim::expert, expert_coordinates);
  shape.set_size(MeshDim::context, P);
  shape.set_expert_spans_context(spans_context);
  return shape;
}

}  // namespace

MeshShape strategy_mesh(const StrategyOptions& options, int world_size) {
  const int T = options.tensor_parallel;
  SHARDLM_CHECK(T >= 1 && world_size % T == 0,
                "--tensor-parallel {} does not divide the job's {} ranks (the tensor ranks "
                "are a factor of the world)", T, world_size);
  MeshShape shape = data_and_context_mesh(options, world_size / T);
  shape.set_size(MeshDim::tensor, T);
  return shape;
}

MeshDims partition_dims() { return {MeshDim::shard, MeshDim::context, MeshDim::expert}; }

MeshDims expert_partition_dims(const MeshShape& mesh) {
  if (mesh.expert_spans_context()) return {MeshDim::shard};
  return {MeshDim::shard, MeshDim::context};
}

int partition_size(const MeshShape& mesh) { return mesh.size(partition_dims()); }

int partition_size(const StrategyOptions& options, int world_size) {
  return partition_size(strategy_mesh(options, world_size));
}

}  // namespace shardlm
