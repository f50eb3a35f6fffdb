// Which strategy runs and its knobs (--strategy, --bucket-mb, --prefetch, ...).
#pragma once

#include <string>

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
};

// Accepts the names and aliases above; Error listing them otherwise.
StrategyKind parse_strategy_kind(const std::string& name);
std::string to_string(StrategyKind kind);

// Ranks a unit is partitioned over: the world for ddp/zero*, the shard group for
// hybrid. Error if the world cannot be split that way.
int partition_size(const StrategyOptions& options, int world_size);

}  // namespace shardlm
