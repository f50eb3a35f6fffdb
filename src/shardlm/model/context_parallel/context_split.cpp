#include "shardlm/model/context_parallel/context_split.hpp"

#include <numeric>

#include "shardlm/core/error.hpp"

namespace shardlm {

ContextSplit::ContextSplit(int rank, int size, bool zigzag, int ulysses_degree)
    : rank_(rank), size_(size), zigzag_(zigzag), ulysses_(zigzag ? ulysses_degree : 1) {
  SHARDLM_CHECK(size >= 1 && rank >= 0 && rank < size, "internal: context rank {} of {}", rank, size);
  SHARDLM_CHECK(ulysses_ >= 1 && size % ulysses_ == 0, "internal: Ulysses groups of {} in {} ranks",
                ulysses_, size);
  if (!zigzag) {
    chunks_.push_back(rank);
    return;
  }
  const int groups = size / ulysses_, group = rank / ulysses_;
  chunks_.push_back(group);
  chunks_.push_back(2 * groups - 1 - group);
}

void ContextSplit::check_seq_len(int seq_len) const {
  if (ulysses_ > 1) {
    // Whole chunks per zigzag group, and the group's tokens in U equal parts.
    const int chunks = chunks_per_row(), needed = std::lcm(chunks, size_);
    SHARDLM_CHECK(seq_len % needed == 0,
                  "--seq-len {} does not split over --context-parallel {} (hybrid, "
                  "--ulysses-degree {}): {} zigzag chunks of {} equal parts need a multiple of {}",
                  seq_len, size_, ulysses_, chunks, ulysses_, needed);
    return;
  }
  SHARDLM_CHECK(seq_len % chunks_per_row() == 0,
                "--seq-len {} does not split over --context-parallel {}: {} needs a multiple of "
                "{}{}",
                seq_len, size_, zigzag_ ? "ring attention's zigzag split" : "the split",
                chunks_per_row(), zigzag_ ? " (2 chunks per rank)" : "");
}

int ContextSplit::global_index(int seq_len, int i) const {
  const int chunk = seq_len / chunks_per_row();
  // Where local token i sits among its zigzag group's tokens (this rank's part of them).
  const int j = (rank_ % ulysses_) * local_len(seq_len) + i;
  return chunks_[static_cast<size_t>(j / chunk)] * chunk + j % chunk;
}

const MicroBatch& ContextSplit::slice(const MicroBatch& full) {
  check_seq_len(full.T);
  const int T = full.T, Tl = local_len(T);
  const size_t n = static_cast<size_t>(full.B) * static_cast<size_t>(Tl);
  tokens_.resize(n);
  positions_.resize(n);
  targets_.resize(full.targets != nullptr ? n : 0);
  for (int b = 0; b < full.B; ++b)
    for (int i = 0; i < Tl; ++i) {
      const int t = global_index(T, i);
      const size_t from = static_cast<size_t>(b) * static_cast<size_t>(T) + static_cast<size_t>(t);
      const size_t to = static_cast<size_t>(b) * static_cast<size_t>(Tl) + static_cast<size_t>(i);
      tokens_[to] = full.tokens[from];
      positions_[to] = full.positions != nullptr ? full.positions[from] : t;
      if (full.targets != nullptr) targets_[to] = full.targets[from];
    }
  local_ = full;
  local_.T = Tl;
  local_.tokens = tokens_.data();
  local_.targets = full.targets != nullptr ? targets_.data() : nullptr;
  local_.positions = positions_.data();
  local_.key_begin = nullptr;
  full_tokens_ = full.tokens;
  full_len_ = T;
  full_key_begin_ = full.key_begin;
  return local_;
}

bool ContextSplit::sliced_from(const MicroBatch& full) const {
  return full.tokens == full_tokens_ && full.T == full_len_ && full.B == local_.B;
}

}  // namespace shardlm
