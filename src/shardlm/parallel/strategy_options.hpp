// Which strategy runs and its knobs (--strategy, --bucket-mb, --prefetch, ...).
#pragma once

#include <string>

#include "shardlm/core/dtype.hpp"
#include "shardlm/parallel/mesh_shape.hpp"

namespace shardlm {

enum class StrategyKind {
  ddp,    // everything replicated; gradients all-reduced in buckets during backward
  zero1,  // optimizer state sharded
  zero2,  // + gradients sharded (alias shard_grad_op)
  zero3,  // + parameters sharded (aliases fsdp, full_shard)
  hybrid  // zero3 inside groups of shard_group_size ranks, replicated across groups
};

struct StrategyOptions {
  StrategyKind kind = StrategyKind::ddp;
  double bucket_mb = 25.0;           // ddp/zero1: gradient bucket cap
  int prefetch = 1;                  // zero3/hybrid: units gathered ahead
  bool reshard_after_forward = true; // zero3/hybrid: free gathered params after forward
  int shard_group_size = 0;          // hybrid: ranks per shard group
  // zero3/hybrid: the type parameters are all-gathered in (the run's compute type:
  // bf16/fp16 gathers half the bytes of fp32; the owned fp32 slice is rounded on the
  // way out). The other strategies hold fp32 parameters, which the model rounds.
  DType param_dtype = DType::fp32;
  // Type gradients travel in when they are reduced (--reduce-dtype): fp32, or bf16
  // (half the bytes; every rank's contribution is rounded to bf16 and the sum is
  // accumulated in fp32, in rank order).
  DType reduce_dtype = DType::fp32;
  // --offload optimizer: the device keeps only the parameters in param_dtype and
  // transient gradients; the fp32 master, the gradient's accumulation and AdamW state
  // are in host memory, where the update runs (parallel/host_owned_state.hpp).
  bool optimizer_on_host = false;
  // --context-parallel: ranks that split each sequence (the mesh's context dimension).
  // They read the same rows and hold the same parameters, so the partition (ZeRO's
  // shards, every gradient reduction) spans shard x context, as DeepSpeed's ZeRO spans
  // DP x SP: with P context ranks a unit is cut into shard x P slices.
  int context_parallel = 1;
  // --expert-parallel E: the mesh's expert dimension. Its ranks read different rows
  // (carved out of the data-parallel ranks, outside the context ones) and each holds
  // experts / E of every sparse layer's experts; dense units are partitioned over
  // shard x context x expert, expert units over shard x context (the expert-data-
  // parallel group of the ranks that hold the same experts). An E the data-parallel
  // ranks (N/P, hybrid's shard group) cannot hold takes the context ranks into the
  // expert group too (strategy_mesh), whose experts' partition is then shard alone.
  int expert_parallel = 1;
  // --tensor-parallel T: the mesh's tensor dimension, innermost (the fastest ranks).
  // Its ranks hold different pieces of the split layers (each tensor coordinate has
  // its own local flat units); the dimensions above share out the world's other ranks.
  int tensor_parallel = 1;
};

// Whether the kind shards parameters (zero3, and hybrid inside its shard groups):
// gathers them before use, and has --prefetch and --reshard-after-forward.
inline bool shards_parameters(StrategyKind kind) {
  return kind == StrategyKind::zero3 || kind == StrategyKind::hybrid;
}

// Accepts the names and aliases above; Error listing them otherwise.
StrategyKind parse_strategy_kind(const std::string& name);
std::string to_string(StrategyKind kind);

// The mesh a run lays out (mesh_shape.hpp), the one place it is built, with P =
// context_parallel, E = expert_parallel, T = tensor_parallel and M = N/T:
// shard=M/P x context=P for ddp/zero*, replicate=M/(G P) x shard=G x context=P for
// hybrid, shard=M/(P E) x expert=E x context=P with expert parallelism (hybrid:
// replicate=M/(G P) x shard=G/E x expert=E x context=P), each with tensor=T innermost.
// An E that does not divide M/P (hybrid: G) but is a multiple of P dividing M (hybrid:
// G P) spans the context ranks: expert=E/P, shard=M/E (hybrid: shard=G P/E), and the
// mesh's expert group is expert x context.
// Error naming the flag if the world cannot be laid out so.
MeshShape strategy_mesh(const StrategyOptions& options, int world_size);
// The mesh dimensions a dense unit is partitioned over (and its gradients reduced
// over): shard x context x expert.
MeshDims partition_dims();
// An expert unit's: the ranks that hold the same experts (Megatron's
// expert-data-parallel group), shard x context, or shard alone when the expert group
// spans the context ranks.
MeshDims expert_partition_dims(const MeshShape& mesh);
// Ranks a dense unit is partitioned over: the size of partition_dims() in the
// strategy's mesh (the layout is built for it; an expert unit's partition divides it).
int partition_size(const StrategyOptions& options, int world_size);
int partition_size(const MeshShape& mesh);

}  // namespace shardlm
