// ContextSplit: which tokens of each row a rank of a context group holds, and this
// rank's share of a micro-batch (docs/parallelism.md "Context parallelism").
//
// Every rank of a context group reads the same rows (the trainer hands each the whole
// micro-batch); each computes on its own tokens of every row: T / P contiguous tokens
// (Ulysses), or the zigzag pair of chunks r and 2P-1-r of T / 2P tokens each (ring:
// every rank then has the same share of the causal mask's work). Positions are the
// global ones (the row's own for packed rows), so RoPE and the documents' starts mean
// what they mean without the split; the loss counts this rank's targets, and their sum
// over the group is the row's.
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/model/model.hpp"

namespace shardlm {

class ContextSplit {
 public:
  // The token chunks of a row rank `rank` of `size` holds: {rank} of `size` chunks, or
  // with zigzag {rank, 2 size - 1 - rank} of 2 size chunks. With zigzag and
  // ulysses_degree U > 1 (hybrid): the zigzag runs over the size / U groups of U
  // consecutive ranks (group g holds chunks g and 2 size / U - 1 - g, in that order),
  // and rank g U + u holds the u-th of U contiguous parts of its group's tokens.
  ContextSplit(int rank, int size, bool zigzag, int ulysses_degree = 1);
  int rank() const { return rank_; }
  int size() const { return size_; }
  int chunks_per_row() const { return zigzag_ ? 2 * size_ / ulysses_ : size_; }
  const std::vector<int>& chunks() const { return chunks_; }  // ascending
  // One-line error unless `seq_len` splits into chunks_per_row() equal chunks.
  void check_seq_len(int seq_len) const;
  // Tokens of a row this rank holds, for rows of seq_len tokens.
  int local_len(int seq_len) const { return seq_len / size_; }
  // The global position in a row of local token i (0 <= i < local_len).
  int global_index(int seq_len, int i) const;

  // This rank's rows of `full` ([B, T] arrays, T the whole row): tokens, targets and
  // positions (global: full.positions', or t) of its tokens, [B, local_len(T)], in
  // arrays it owns; key_begin null (the attention reads the full rows', full_key_begin).
  // Valid until the next call.
  const MicroBatch& slice(const MicroBatch& full);
  const MicroBatch& local() const { return local_; }
  // The sliced micro-batch's whole rows: their T, and their key_begin (may be null).
  int full_len() const { return full_len_; }
  const int32_t* full_key_begin() const { return full_key_begin_; }
  // Whether `full` is the micro-batch slice() was last given.
  bool sliced_from(const MicroBatch& full) const;

 private:
  int rank_, size_;
  bool zigzag_;
  int ulysses_;  // zigzag: ranks per zigzag group (1: every rank its own)
  std::vector<int> chunks_;
  std::vector<int32_t> tokens_, targets_, positions_;
  MicroBatch local_;
  const int32_t* full_tokens_ = nullptr;
  int full_len_ = 0;
  const int32_t* full_key_begin_ = nullptr;
};

}  // namespace shardlm
