#include "shardlm/model/context_parallel/ring_attention.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"

namespace shardlm {

RingAttention::RingAttention(Communicator& group, const ContextSplit& split,
                             const ContextHeads& heads, int seq_len, DType compute)
    : group_(group),
      split_(split),
      ring_(group.rank(), group.size(), /*zigzag=*/true),
      heads_(heads),
      P_(group.size()),
      rank_(group.rank()),
      T_(seq_len),
      compute_(compute) {
  SHARDLM_CHECK(split.chunks_per_row() == 2 * P_,
                "internal: ring attention over {} ranks on a split into {} chunks", P_,
                split.chunks_per_row());
  split.check_seq_len(seq_len);
}

AttentionBlockShape RingAttention::block_shape(int B) const {
  const int Tl = split_.full_len() / P_;
  return {B, Tl, Tl, heads_.n_head, heads_.n_kv_head, heads_.head_dim};
}

void RingAttention::carve(ArenaCarver& carver, int slots, int max_batch) {
  max_batch_ = max_batch;
  const int64_t rows = static_cast<int64_t>(max_batch) * (T_ / P_);  // this rank's tokens
  saved_.assign(static_cast<size_t>(slots), Saved{});
  for (Saved& s : saved_) carver.request(&s.lse, rows * heads_.n_head);
  const int64_t kv = rows * 2 * heads_.kv_columns();
  for (int i = 0; i < 2; ++i) {
    carver.request(&kv_[i], compute_, kv);
    carver.request(&dkv_[i], kv);
  }
  carver.request(&out_, rows * heads_.q_columns());
  carver.request(&block_out_, rows * heads_.q_columns());
  carver.request(&block_lse_, rows * heads_.n_head);
  carver.request(&dq_, rows * heads_.q_columns());
  carver.request(&ranges_device_, static_cast<int64_t>(P_) * rows * 2);
}

void RingAttention::begin_micro_batch(Backend& backend) {
  const int T = split_.full_len(), Tl = T / P_, B = split_.local().B;
  SHARDLM_CHECK(T <= T_, "internal: ring attention for rows of {} tokens got {}", T_, T);
  SHARDLM_CHECK(B <= max_batch_, "internal: {} rows, ring attention has room for {}", B,
                max_batch_);
  const int32_t* key_begin = split_.full_key_begin();
  const size_t per_source = static_cast<size_t>(B) * static_cast<size_t>(Tl) * 2;
  ranges_.resize(static_cast<size_t>(P_) * per_source);
  std::vector<int> key_positions(static_cast<size_t>(Tl));
  for (int source = 0; source < P_; ++source) {
    // The source's tokens in the row, ascending (two chunks): a query's visible keys
    // (from its document's start to itself) are one run of them.
    const ContextSplit held(source, P_, /*zigzag=*/true);
    for (int j = 0; j < Tl; ++j) key_positions[static_cast<size_t>(j)] = held.global_index(T, j);
    int32_t* range = ranges_.data() + static_cast<size_t>(source) * per_source;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Tl; ++i) {
        const int t = ring_.global_index(T, i);
        const int begin = key_begin != nullptr ? key_begin[static_cast<int64_t>(b) * T + t] : 0;
        const size_t q = static_cast<size_t>(b) * static_cast<size_t>(Tl) + static_cast<size_t>(i);
        range[2 * q] = static_cast<int32_t>(
            std::lower_bound(key_positions.begin(), key_positions.end(), begin) -
            key_positions.begin());
        range[2 * q + 1] = static_cast<int32_t>(
            std::upper_bound(key_positions.begin(), key_positions.end(), t) -
            key_positions.begin());
      }
  }
  if (backend.device().is_host()) {
    ranges_view_ = ranges_.data();
    return;
  }
  backend.copy_from_host(ranges_device_, ranges_.data(), sizeof(int32_t) * ranges_.size());
  ranges_view_ = ranges_device_;
}

const int32_t* RingAttention::key_range(int source) const {
  const int Tl = split_.full_len() / P_;
  return ranges_view_ + static_cast<int64_t>(source) * split_.local().B * Tl * 2;
}

void RingAttention::forward(int slot, Backend& be, ConstTypedPtr qkv, TypedPtr out, int B) {
  Saved& s = saved_.at(static_cast<size_t>(slot));
  s.qkv = qkv;
  s.out = out;
  const AttentionBlockShape shape = block_shape(B);
  const int64_t n = static_cast<int64_t>(B) * shape.q_len;
  const int64_t QKV = heads_.qkv_columns(), Q = heads_.q_columns(), KV = shape.kv_columns();
  const size_t kv_count = static_cast<size_t>(n * KV);
  int at = 0;  // kv_[at]: the block at hand
  be.convert_rows(kv_[at], KV, qkv.at(Q), QKV, n, KV);  // this rank's k | v
  for (int step = 0; step < P_; ++step) {
    const int source = (rank_ - step + P_) % P_;
    Work arriving;
    if (step + 1 < P_)
      arriving = group_.send_recv(kv_[at], kv_count, next(), kv_[1 - at], kv_count, previous(),
                                  "ring k|v");
    if (step == 0) {
      be.attention_block_forward(out_, s.lse, qkv, QKV, kv_[at], shape, key_range(source));
    } else {
      be.attention_block_forward(block_out_, block_lse_, qkv, QKV, kv_[at], shape,
                                 key_range(source));
      be.attention_lse_merge(out_, s.lse, block_out_, block_lse_, shape);
    }
    if (step + 1 < P_) {
      arriving.wait();
      at = 1 - at;
    }
  }
  be.convert_rows(out, Q, ConstTypedPtr(out_), Q, n, Q);
}

void RingAttention::backward(int slot, Backend& be, const float* dout, float* dqkv, int B) {
  const Saved& s = saved_.at(static_cast<size_t>(slot));
  const AttentionBlockShape shape = block_shape(B);
  const int64_t n = static_cast<int64_t>(B) * shape.q_len;
  const int64_t QKV = heads_.qkv_columns(), Q = heads_.q_columns(), KV = shape.kv_columns();
  const size_t kv_count = static_cast<size_t>(n * KV);
  int at = 0, grad_at = 0;
  be.convert_rows(kv_[at], KV, s.qkv.at(Q), QKV, n, KV);
  be.fill_zero(dq_, sizeof(float) * static_cast<size_t>(n * Q));
  be.fill_zero(dkv_[grad_at], sizeof(float) * kv_count);
  for (int step = 0; step < P_; ++step) {
    const int source = (rank_ - step + P_) % P_;
    Work arriving;
    if (step + 1 < P_)
      arriving = group_.send_recv(kv_[at], kv_count, next(), kv_[1 - at], kv_count, previous(),
                                  "ring k|v (backward)");
    be.attention_block_backward(dq_, dkv_[grad_at], dout, s.out, s.lse, s.qkv, QKV, kv_[at],
                                shape, key_range(source));
    // The block's gradient goes on with it; after the last step the one arriving is this
    // rank's own block, every rank's share added.
    group_.send_recv(ConstTypedPtr(dkv_[grad_at]), kv_count, next(), TypedPtr(dkv_[1 - grad_at]),
                     kv_count, previous(), "ring k|v gradient")
        .wait();
    grad_at = 1 - grad_at;
    if (step + 1 < P_) {
      arriving.wait();
      at = 1 - at;
    }
  }
  const TypedPtr dst(dqkv);
  be.convert_rows(dst, QKV, ConstTypedPtr(dq_), Q, n, Q);
  be.convert_rows(dst.at(Q), QKV, ConstTypedPtr(dkv_[grad_at]), KV, n, KV);
}

}  // namespace shardlm
