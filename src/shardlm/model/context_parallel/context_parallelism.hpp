// ContextParallelism: what a model holds to split its sequences over a context group
// (ModelOptions::parallel_groups.context of more than one rank): this rank's share of
// each row (ContextSplit) and the attention across the group's ranks (ContextAttention),
// of the kind and Ulysses degree the options name. Every family that splits sequences
// holds one (llama, qwen2, qwen3 and their mixtures of experts, gpt2): the model computes
// on local_batch()'s tokens and calls attention() where it would call its local kernel.
#pragma once

#include <memory>

#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/model/context_parallel/context_split.hpp"

namespace shardlm {

class ContextParallelism {
 public:
  // Null unless `options` name a context group of more than one rank; one-line error
  // unless rows of max_seq tokens split as the kind needs. Carves the attention's arrays
  // for `slots` layers' state (one with activation checkpointing) and max_batch rows.
  static std::unique_ptr<ContextParallelism> make(const ModelOptions& options,
                                                  const ContextHeads& heads, int max_batch,
                                                  int max_seq, DType compute, int slots,
                                                  ArenaCarver& carver);
  ContextParallelism(const ContextParallelism&) = delete;
  ContextParallelism& operator=(const ContextParallelism&) = delete;

  // Tokens of a row this rank holds, for rows of `seq_len` tokens.
  int local_len(int seq_len) const { return split_.local_len(seq_len); }
  // This rank's slice of the micro-batch `full`: cut (and the attention told) when
  // `starts` (the embeddings' forward), else the slice cut then, checked to be of `full`.
  const MicroBatch& local_batch(const MicroBatch& full, bool starts, Backend& backend);
  ContextAttention& attention() { return *attention_; }
  const ContextSplit& split() const { return split_; }

 private:
  ContextParallelism(const ModelOptions& options, Communicator& group);

  ContextSplit split_;  // before attention_, which reads it
  std::unique_ptr<ContextAttention> attention_;
};

}  // namespace shardlm
