#include "shardlm/model/tensor_parallel/vocab_parallel.hpp"

#include <algorithm>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm {

VocabShard VocabShard::of(int vocab_size, int padded_vocab, TensorSplit split) {
  SHARDLM_ASSERT(split.size >= 1 && padded_vocab % split.size == 0 && vocab_size <= padded_vocab);
  VocabShard s;
  s.rows = padded_vocab / split.size;
  s.begin = static_cast<int64_t>(split.rank) * s.rows;
  s.real = static_cast<int>(std::clamp<int64_t>(vocab_size - s.begin, 0, s.rows));
  s.vocab = vocab_size;
  return s;
}

void VocabParallelEmbedding::carve(ArenaCarver& carver, int64_t n, VocabShard shard) {
  shard_ = shard;
  carver.request(&local_tokens_, n);
}

void VocabParallelEmbedding::forward(Backend& be, const TensorParallelBlock& tp, float* out,
                                     const int32_t* tokens, ConstTypedPtr table, int B, int T,
                                     int C, DType value_type, float* scatter_to) {
  const int64_t n = static_cast<int64_t>(B) * T;
  be.vocab_shard_localize(local_tokens_, tokens, n, shard_.held());
  be.embedding_forward(out, local_tokens_, table, ConstTypedPtr(), B, T, C, value_type, nullptr);
  be.vocab_shard_mask_rows(out, tokens, n, C, shard_.held());
  if (scatter_to != nullptr)
    tp.sum_scatter(out, scatter_to, n / tp.size() * C, "tensor.vocab_embedding");
  else
    tp.sum_partial(out, n * C, "tensor.vocab_embedding");
}

void VocabParallelEmbedding::backward(Backend& be, float* dtable, float* dout,
                                      const int32_t* tokens, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(B) * T;
  // A held-elsewhere token adds a zero row to row 0: x + 0 is x, so the rows held here
  // sum their tokens in the unsplit kernel's order.
  be.vocab_shard_mask_rows(dout, tokens, n, C, shard_.held());
  be.embedding_backward(dtable, nullptr, dout, local_tokens_, B, T, C, nullptr);
}

void VocabParallelHead::carve(ArenaCarver& carver, int64_t n, VocabShard shard, int padded_vocab,
                              int C, DType compute) {
  shard_ = shard;
  C_ = C;
  chunk_rows_ = LmHead::chunk_rows_for(n, padded_vocab);
  const int64_t chunk = static_cast<int64_t>(chunk_rows_) * shard.rows;
  carver.request(&logits_chunk_, chunk);
  carver.request(&row_max_, chunk_rows_);
  carver.request(&row_sums_, 2 * static_cast<int64_t>(chunk_rows_));
  carver.request(&row_loss_, n);
  if (compute != DType::fp32) carver.request(&dlogits_c_, compute, chunk);
}

double VocabParallelHead::loss(Backend& be, const TensorParallelBlock& tp, ConstTypedPtr x,
                               ConstTypedPtr weight, const int32_t* targets,
                               const int32_t* host_targets, int64_t n, float grad_scale,
                               float* dx, float* dweight, bool scatter_dx) const {
  const PhaseScope phase(Phase::loss);
  const bool want_grad = dx != nullptr;
  const int Vl = shard_.rows, Vr = shard_.real, C = C_;
  const VocabShardRows held = shard_.held();
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(C);
  for (int64_t r0 = 0; r0 < n; r0 += chunk_rows_) {
    const int rows = static_cast<int>(std::min<int64_t>(chunk_rows_, n - r0));
    const int32_t* t = targets + r0;
    const ConstTypedPtr xc = x.at(r0 * C);
    if (!be.is_meta() &&
        std::none_of(host_targets + r0, host_targets + r0 + rows, [](int32_t v) { return v >= 0; })) {
      // Every tensor rank sees the same targets: all skip the chunk's collectives.
      be.fill_zero(row_loss_ + r0, sizeof(float) * static_cast<size_t>(rows));
      if (want_grad) be.fill_zero(dx + r0 * C, row_bytes * static_cast<size_t>(rows));
      continue;
    }
    float* logits = logits_chunk_;
    if (Vr > 0) be.gemm(false, true, rows, Vr, C, 1.0f, xc, C, weight, C, 0.0f, logits, Vl);
    be.vocab_shard_row_max(row_max_, logits, Vl, rows, held);
    tp.max_partial(row_max_, rows, "tensor.vocab_head_max");
    // The target's logit, then the row becomes its softmax numerators e^(l - max).
    be.vocab_shard_softmax_sums(row_sums_, logits, Vl, row_max_, t, rows, held);
    tp.sum_partial(row_sums_, 2 * static_cast<int64_t>(rows), "tensor.vocab_head_sums");
    be.vocab_shard_loss(row_loss_ + r0, row_max_, row_sums_, t, rows);
    if (!want_grad) continue;
    if (Vr == 0) {  // a rank of padding rows only: no logits, no share of the input gradient
      be.fill_zero(dx + r0 * C, row_bytes * static_cast<size_t>(rows));
      continue;
    }
    // grad_scale * (softmax - onehot) in place, as the unsplit kernel forms it.
    be.vocab_shard_softmax_backward(logits, Vl, row_sums_, t, rows, grad_scale, held);
    ConstTypedPtr dlogits(logits);
    if (dlogits_c_.data != nullptr) {
      be.convert_rows(dlogits_c_, Vl, ConstTypedPtr(logits), Vl, rows, Vr);
      dlogits = dlogits_c_;
    }
    be.gemm(false, false, rows, C, Vr, 1.0f, dlogits, Vl, weight, C, 0.0f, dx + r0 * C, C);
    if (dweight != nullptr) be.gemm(true, false, Vr, C, rows, 1.0f, dlogits, Vl, xc, C, 1.0f, dweight, C);
  }
  const int64_t block = n / tp.size() * C;
  if (want_grad && scatter_dx)
    tp.sum_scatter(dx, dx + tp.rank() * block, block, "tensor.vocab_head_in_grad");
  else if (want_grad)
    tp.sum_partial(dx, n * C, "tensor.vocab_head_in_grad");
  return be.sum(row_loss_, n);
}

void VocabParallelHead::logits(Backend& be, const TensorParallelBlock& tp, ConstTypedPtr x,
                               int64_t ld, int rows, ConstTypedPtr weight, float* out) const {
  const int Vl = shard_.rows;
  const int64_t local_count = static_cast<int64_t>(rows) * Vl;
  const size_t local_bytes = sizeof(float) * static_cast<size_t>(local_count);
  // This rank's [rows, Vl] columns (the padding ones stay zero) and every rank's after them.
  const TrackedBuffer scratch =
      allocate_on(be, MemCategory::other, local_bytes * static_cast<size_t>(tp.size() + 1));
  float* local = scratch.as<float>();
  float* all = local + local_count;
  if (shard_.real > 0)
    be.gemm(false, true, rows, shard_.real, C_, 1.0f, x, static_cast<int>(ld), weight, C_, 0.0f,
            local, Vl);
  tp.gather(local, all, local_count, "tensor.vocab_logits");
  std::vector<float> host(static_cast<size_t>(tp.size()) * static_cast<size_t>(local_count));
  be.copy_to_host(host.data(), all, sizeof(float) * host.size());
  for (int t = 0; t < tp.size(); ++t)
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < Vl; ++j) {
        const int64_t column = static_cast<int64_t>(t) * Vl + j;
        if (column < shard_.vocab)
          out[static_cast<int64_t>(r) * shard_.vocab + column] =
              host[(static_cast<size_t>(t) * rows + static_cast<size_t>(r)) * Vl + static_cast<size_t>(j)];
      }
}

}  // namespace shardlm
