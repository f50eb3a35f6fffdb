#include "shardlm/model/context_parallel/context_parallelism.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

ContextParallelism::ContextParallelism(const ModelOptions& options, Communicator& group)
    : split_(group.rank(), group.size(), zigzag_split(options.context_parallel_kind),
             split_ulysses_degree(options.context_parallel_kind, options.ulysses_degree)) {}

std::unique_ptr<ContextParallelism> ContextParallelism::make(const ModelOptions& options,
                                                             const ContextHeads& heads,
                                                             int max_batch, int max_seq,
                                                             DType compute, int slots,
                                                             ArenaCarver& carver) {
  Communicator* group = options.parallel_groups.context;
  if (group == nullptr || group->size() == 1) return nullptr;
  std::unique_ptr<ContextParallelism> cp(new ContextParallelism(options, *group));
  cp->split_.check_seq_len(max_seq);
  const ContextParallelKind kind = options.context_parallel_kind;
  cp->attention_ = make_context_attention(kind, split_ulysses_degree(kind, options.ulysses_degree),
                                          *group, cp->split_, heads, max_seq, compute);
  cp->attention_->carve(carver, slots, max_batch);
  return cp;
}

const MicroBatch& ContextParallelism::local_batch(const MicroBatch& full, bool starts,
                                                  Backend& backend) {
  if (starts) {
    split_.slice(full);
    attention_->begin_micro_batch(backend);
  } else {
    SHARDLM_CHECK(split_.sliced_from(full), "model: a unit's call is for another micro-batch "
                  "than the embeddings' forward saw");
  }
  return split_.local();
}

}  // namespace shardlm
