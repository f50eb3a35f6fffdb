#include "shardlm/model/context_parallel/context_attention.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/model/context_parallel/hybrid_attention.hpp"
#include "shardlm/model/context_parallel/ring_attention.hpp"
#include "shardlm/model/context_parallel/ulysses_attention.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

ContextParallelKind parse_context_parallel_kind(const std::string& name) {
  if (name == "ulysses") return ContextParallelKind::ulysses;
  if (name == "ring") return ContextParallelKind::ring;
  if (name == "hybrid") return ContextParallelKind::hybrid;
  throw Error(fmt::format("--context-parallel-kind must be ulysses, ring or hybrid, got '{}'", name));
}

const char* context_parallel_kind_name(ContextParallelKind kind) {
  switch (kind) {
    case ContextParallelKind::ring: return "ring";
    case ContextParallelKind::hybrid: return "hybrid";
    case ContextParallelKind::ulysses: break;
  }
  return "ulysses";
}

void check_ulysses_degree(int P, ContextParallelKind kind, int U) {
  if (kind != ContextParallelKind::hybrid) {
    SHARDLM_CHECK(U == 1,
                  "--ulysses-degree {} needs --context-parallel-kind hybrid (got {}): it sizes "
                  "hybrid's Ulysses groups",
                  U, context_parallel_kind_name(kind));
    return;
  }
  SHARDLM_CHECK(U > 1 && U < P && P % U == 0,
                "--context-parallel {} --context-parallel-kind hybrid needs --ulysses-degree U "
                "with 1 < U < {} dividing {} (Ulysses inside groups of U, ring across {} / U), "
                "got {}",
                P, P, P, P, U);
}

void check_context_parallel_model(const ModelConfig& config, int P, ContextParallelKind kind,
                                  int tensor_size, int ulysses_degree) {
  if (P == 1) return;
  if (kind == ContextParallelKind::ulysses && tensor_size > 1) {
    // The context ranks split a tensor rank's own heads.
    const int q = config.n_head / tensor_size, kv = tensor_local_kv_heads(config, tensor_size);
    SHARDLM_CHECK(q % P == 0 && (kv % P == 0 || P % kv == 0),
                  "--context-parallel {} (ulysses) with --tensor-parallel {}: a tensor rank's {} "
                  "query and {} key/value heads (of the model's {} and {}) do not split over {} "
                  "context ranks", P, tensor_size, q, kv, config.n_head, config.kv_heads(), P);
  }
  const ContextHeads heads{config.n_head, config.kv_heads(), config.head_dim()};
  if (kind == ContextParallelKind::ulysses) check_context_heads(P, heads);
  if (kind != ContextParallelKind::hybrid) return;
  check_ulysses_degree(P, kind, ulysses_degree);
  // Each Ulysses group splits a tensor rank's own heads (the model's at T = 1).
  const int U = ulysses_degree, q = config.n_head / tensor_size,
            kv = tensor_size > 1 ? tensor_local_kv_heads(config, tensor_size) : config.kv_heads();
  const char* whose = tensor_size > 1 ? "a tensor rank's" : "the model's";
  SHARDLM_CHECK(q % U == 0,
                "--ulysses-degree {} (hybrid) splits the attention heads over each Ulysses "
                "group: {} {} query heads do not divide by {}",
                U, whose, q, U);
  SHARDLM_CHECK(kv % U == 0 || U % kv == 0,
                "--ulysses-degree {} (hybrid): {} {} key/value heads neither divide by {} nor "
                "replicate evenly onto {} ranks",
                U, whose, kv, U, U);
}

void check_context_heads(int P, const ContextHeads& h) {
  SHARDLM_CHECK(h.n_head % P == 0,
                "--context-parallel {} (ulysses) splits the attention heads over the ranks: the "
                "model's {} query heads do not divide by {}",
                P, h.n_head, P);
  SHARDLM_CHECK(h.n_kv_head % P == 0 || P % h.n_kv_head == 0,
                "--context-parallel {} (ulysses): the model's {} key/value heads neither divide "
                "by {} nor replicate evenly onto {} ranks ({} must divide the heads or be a "
                "multiple of them)",
                P, h.n_kv_head, P, P, P);
}

std::unique_ptr<ContextAttention> make_context_attention(ContextParallelKind kind,
                                                         int ulysses_degree,
                                                         Communicator& group,
                                                         const ContextSplit& split,
                                                         const ContextHeads& heads, int seq_len,
                                                         DType compute) {
  if (kind == ContextParallelKind::hybrid)
    return std::make_unique<HybridAttention>(group, ulysses_degree, split, heads, seq_len, compute);
  if (kind == ContextParallelKind::ring)
    return std::make_unique<RingAttention>(group, split, heads, seq_len, compute);
  return std::make_unique<UlyssesAttention>(group, split, heads, seq_len, compute);
}

}  // namespace shardlm
