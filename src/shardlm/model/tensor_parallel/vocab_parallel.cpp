#include "shardlm/model/tensor_parallel/vocab_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/core/error.hpp"
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

void VocabParallelEmbedding::localize(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    local_tokens_[i] = shard_.holds(tokens[i]) ? static_cast<int32_t>(tokens[i] - shard_.begin) : 0;
}

void VocabParallelEmbedding::forward(Backend& be, const TensorParallelBlock& tp, float* out,
                                     const int32_t* tokens, ConstTypedPtr table, int B, int T,
                                     int C, DType value_type, float* scatter_to) {
  const int64_t n = static_cast<int64_t>(B) * T;
  const bool meta = be.is_meta();
  if (!meta) localize(tokens, n);
  be.embedding_forward(out, local_tokens_, table, ConstTypedPtr(), B, T, C, value_type, nullptr);
  if (!meta)
    for (int64_t i = 0; i < n; ++i)
      if (!shard_.holds(tokens[i])) std::memset(out + i * C, 0, sizeof(float) * static_cast<size_t>(C));
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
  if (!be.is_meta())
    for (int64_t i = 0; i < n; ++i)
      if (!shard_.holds(tokens[i])) std::memset(dout + i * C, 0, sizeof(float) * static_cast<size_t>(C));
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
                               ConstTypedPtr weight, const int32_t* targets, int64_t n,
                               float grad_scale, float* dx, float* dweight,
                               bool scatter_dx) const {
  const PhaseScope phase(Phase::loss);
  const bool meta = be.is_meta(), want_grad = dx != nullptr;
  const int Vl = shard_.rows, Vr = shard_.real, C = C_;
  for (int64_t r0 = 0; r0 < n; r0 += chunk_rows_) {
    const int rows = static_cast<int>(std::min<int64_t>(chunk_rows_, n - r0));
    const int32_t* t = targets + r0;
    const ConstTypedPtr xc = x.at(r0 * C);
    if (!meta && std::none_of(t, t + rows, [](int32_t v) { return v >= 0; })) {
      // Every tensor rank sees the same targets: all skip the chunk's collectives.
      std::fill(row_loss_ + r0, row_loss_ + r0 + rows, 0.0f);
      if (want_grad) std::memset(dx + r0 * C, 0, sizeof(float) * static_cast<size_t>(rows) * C);
      continue;
    }
    float* logits = logits_chunk_;
    if (Vr > 0) be.gemm(false, true, rows, Vr, C, 1.0f, xc, C, weight, C, 0.0f, logits, Vl);
    if (!meta)
      for (int r = 0; r < rows; ++r) {
        const float* row = logits + static_cast<int64_t>(r) * Vl;
        row_max_[r] = Vr > 0 ? *std::max_element(row, row + Vr) : -std::numeric_limits<float>::infinity();
      }
    tp.max_partial(row_max_, rows, "tensor.vocab_head_max");
    if (!meta) {
#pragma omp parallel for schedule(static)
      for (int r = 0; r < rows; ++r) {
        float* row = logits + static_cast<int64_t>(r) * Vl;
        // The target's logit, then the row becomes its softmax numerators e^(l - max).
        row_sums_[2 * r + 1] = t[r] >= 0 && shard_.holds(t[r]) ? row[t[r] - shard_.begin] : 0.0f;
        float sum = 0.0f;
        for (int j = 0; j < Vr; ++j) {
          row[j] = cpu::exp_approx(row[j] - row_max_[r]);
          sum += row[j];
        }
        row_sums_[2 * r] = sum;
      }
    }
    tp.sum_partial(row_sums_, 2 * static_cast<int64_t>(rows), "tensor.vocab_head_sums");
    if (meta) {
      if (want_grad && Vr > 0) {
        be.gemm(false, false, rows, C, Vr, 1.0f, logits, Vl, weight, C, 0.0f, dx + r0 * C, C);
        if (dweight != nullptr)
          be.gemm(true, false, Vr, C, rows, 1.0f, logits, Vl, xc, C, 1.0f, dweight, C);
      }
      continue;
    }
    for (int r = 0; r < rows; ++r)
      row_loss_[r0 + r] = t[r] < 0 ? 0.0f
                                   : row_max_[r] + std::log(row_sums_[2 * r]) - row_sums_[2 * r + 1];
    if (!want_grad) continue;
    if (Vr == 0) {  // a rank of padding rows only: no logits, no share of the input gradient
      std::memset(dx + r0 * C, 0, sizeof(float) * static_cast<size_t>(rows) * C);
      continue;
    }
    // grad_scale * (softmax - onehot) in place, as the unsplit kernel forms it.
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r) {
      float* row = logits + static_cast<int64_t>(r) * Vl;
      if (t[r] < 0) {
        std::fill(row, row + Vr, 0.0f);
        continue;
      }
      const float factor = grad_scale / row_sums_[2 * r];
      for (int j = 0; j < Vr; ++j) row[j] *= factor;
      if (shard_.holds(t[r])) row[t[r] - shard_.begin] -= grad_scale;
    }
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
  return meta ? 0.0 : be.sum(row_loss_, n);
}

void VocabParallelHead::logits(Backend& be, const TensorParallelBlock& tp, ConstTypedPtr x,
                               int64_t ld, int rows, ConstTypedPtr weight, float* out) const {
  SHARDLM_CHECK(be.device().is_host(), "model: vocabulary-parallel logits run on the CPU; this "
                "model runs on {}", be.description());
  const int Vl = shard_.rows;
  std::vector<float> local(static_cast<size_t>(rows) * Vl, 0.0f);
  if (shard_.real > 0)
    be.gemm(false, true, rows, shard_.real, C_, 1.0f, x, static_cast<int>(ld), weight, C_, 0.0f,
            local.data(), Vl);
  std::vector<float> all(static_cast<size_t>(tp.size()) * local.size());
  tp.gather(local.data(), all.data(), static_cast<int64_t>(local.size()), "tensor.vocab_logits");
  for (int t = 0; t < tp.size(); ++t)
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < Vl; ++j) {
        const int64_t column = static_cast<int64_t>(t) * Vl + j;
        if (column < shard_.vocab)
          out[static_cast<int64_t>(r) * shard_.vocab + column] =
              all[(static_cast<size_t>(t) * rows + static_cast<size_t>(r)) * Vl + static_cast<size_t>(j)];
      }
}

}  // namespace shardlm
