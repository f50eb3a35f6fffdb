#include "shardlm/model/tensor_parallel/sequence_parallel_rows.hpp"

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {

void SequenceParallelRows::check_max_tokens(int64_t max_batch, int64_t max_seq) const {
  SHARDLM_CHECK(!on_ || max_batch * max_seq % size_ == 0,
                "--sequence-parallel: a micro-batch of {} x {} tokens does not divide into "
                "--tensor-parallel {} equal parts", max_batch, max_seq, size_);
}

void SequenceParallelRows::check_tokens(int64_t B, int64_t T) const {
  SHARDLM_CHECK(!on_ || B * T % size_ == 0,
                "--sequence-parallel: the micro-batch's {} x {} tokens here do not divide into "
                "--tensor-parallel {} equal parts", B, T, size_);
}

void SequenceParallelRows::carve(ArenaCarver& carver, int64_t n, int64_t norm_floats) {
  if (!on_) return;
  carver.request(&dres_whole_, n * width_);
  carver.request(&norm_grad_, norm_floats);
}

void SequenceParallelRows::gather(const TensorParallelBlock& tp, TypedPtr whole, int64_t n,
                                  const char* label) const {
  if (on_) tp.gather_in_place(whole, rows(n) * width_, label);
}

float* SequenceParallelRows::sum_rows(const TensorParallelBlock& tp, float* partial, int64_t n,
                                      const char* label) const {
  return start_sum_rows(tp, partial, n, label).finish();
}

SequenceParallelRows::PendingRows SequenceParallelRows::start_sum_rows(const TensorParallelBlock& tp,
                                                                       float* partial, int64_t n,
                                                                       const char* label) const {
  if (!on_) return {&tp, tp.start_sum_partial(partial, n * width_, label), partial};
  float* block = partial + block_offset(n);
  return {&tp, tp.start_sum_scatter(partial, block, rows(n) * width_, label), block};
}

float* SequenceParallelRows::whole_dres(Backend& backend, const TensorParallelBlock& tp, float* dres,
                                        int64_t n) const {
  if (!on_) return dres;
  backend.convert_rows(dres_whole_ + block_offset(n), width_, dres, width_, rows(n), width_);
  tp.gather_in_place(dres_whole_, rows(n) * width_, "tensor.sequence_dres");
  return dres_whole_;
}

float* SequenceParallelRows::norm_grads(Backend& backend, int64_t count) const {
  SHARDLM_ASSERT(on_);
  backend.fill_zero(norm_grad_, sizeof(float) * static_cast<size_t>(count));
  return norm_grad_;
}

void SequenceParallelRows::add_norm_grads(Backend& backend, const TensorParallelBlock& tp,
                                          std::initializer_list<float*> targets, int64_t each) const {
  SHARDLM_ASSERT(on_);
  tp.sum_partial(norm_grad_, static_cast<int64_t>(targets.size()) * each, "tensor.sequence_norm_grad");
  const float* from = norm_grad_;
  for (float* target : targets) {
    backend.accumulate(target, from, each);
    from += each;
  }
}

}  // namespace shardlm
