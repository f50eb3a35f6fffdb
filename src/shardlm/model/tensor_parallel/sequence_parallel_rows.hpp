// SequenceParallelRows: where a decoder's residual stream lives on one tensor rank under
// Megatron's sequence parallelism (docs/parallelism.md "Tensor parallelism"), shared by
// the llama and gpt2 models. With it on (options.sequence_parallel, T > 1) each tensor
// rank holds a block of n / T of the micro-batch's n token rows of the residual stream,
// its norms and residual adds; a norm's output is gathered whole for the column-parallel
// GEMMs, the row-parallel GEMMs' partial sums are reduce-scattered back to the blocks (the
// all-reduce's two halves); backward mirrors it. Off (or one tensor rank), every row is
// here and the calls are the plain tensor-parallel all-reduce or nothing.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "shardlm/core/dtype.hpp"
#include "shardlm/model/model_support.hpp"
#include "shardlm/model/tensor_parallel/tensor_parallel_block.hpp"

namespace shardlm {

class Backend;

class SequenceParallelRows {
 public:
  SequenceParallelRows() = default;
  // `on`: sequence parallelism asked for and more than one tensor rank; `width`: the
  // residual stream's channels (C).
  SequenceParallelRows(bool on, int tensor_size, int tensor_rank, int64_t width)
      : on_(on && tensor_size > 1), size_(tensor_size), rank_(tensor_rank), width_(width) {}
  bool on() const { return on_; }
  // Rows of the residual stream here out of the micro-batch's n: n, or this rank's n / T.
  int64_t rows(int64_t n) const { return on_ ? n / size_ : n; }
  // Element offset of this rank's block inside a whole [n, width] array.
  int64_t block_offset(int64_t n) const { return on_ ? rank_ * rows(n) * width_ : 0; }
  TypedPtr block_of(TypedPtr whole, int64_t n) const { return whole.at(block_offset(n)); }
  // One-line errors when a model built for max_batch x max_seq tokens a rank, or a
  // micro-batch of B x T tokens here, does not divide into the tensor ranks' blocks.
  void check_max_tokens(int64_t max_batch, int64_t max_seq) const;
  void check_tokens(int64_t B, int64_t T) const;
  // The scratch it needs (when on): the gathered residual gradient [n, width] and the
  // norm weights' gradients over a block [norm_floats].
  void carve(ArenaCarver& carver, int64_t n, int64_t norm_floats);

  // whole [n, width]: each rank's block (written at block_of) gathered in place.
  void gather(const TensorParallelBlock& tp, TypedPtr whole, int64_t n, const char* label) const;
  // A row-parallel GEMM's output, or the column-parallel GEMMs' input gradient: partial
  // sums [n, width] -> the sum (when on: this rank's block of it, in place at
  // block_offset); returns where it is.
  float* sum_rows(const TensorParallelBlock& tp, float* partial, int64_t n, const char* label) const;
  // sum_rows started: the caller computes meanwhile (the column-parallel input
  // gradient's reduction travels while the weight gradient's GEMM runs, Megatron's
  // overlap) and reads the rows only after finish().
  struct PendingRows {
    const TensorParallelBlock* tp = nullptr;
    Work work;
    float* rows = nullptr;
    float* finish() {
      tp->wait(work);
      return rows;
    }
  };
  PendingRows start_sum_rows(const TensorParallelBlock& tp, float* partial, int64_t n, const char* label) const;
  // The residual gradient as the GEMMs read it: dres itself, or (when on) every rank's
  // block of it gathered into the whole [n, width] scratch.
  float* whole_dres(Backend& backend, const TensorParallelBlock& tp, float* dres, int64_t n) const;
  // Norm weight gradients over a block: when on, `count` zeroed scratch floats for the
  // norm's backward to write, which add_norm_grads sums over the group and adds into the
  // targets (count / targets each); off, targets are written directly (null: none).
  float* norm_grads(Backend& backend, int64_t count) const;
  void add_norm_grads(Backend& backend, const TensorParallelBlock& tp, std::initializer_list<float*> targets,
                      int64_t each) const;

 private:
  bool on_ = false;
  int size_ = 1, rank_ = 0;
  int64_t width_ = 0;
  float* dres_whole_ = nullptr;  // [n, width]
  float* norm_grad_ = nullptr;   // [norm_floats]
};

}  // namespace shardlm
