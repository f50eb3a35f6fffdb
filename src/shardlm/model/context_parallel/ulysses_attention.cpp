#include "shardlm/model/context_parallel/ulysses_attention.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

ContextHeads heads_per_rank(int P, const ContextHeads& h) {
  check_context_heads(P, h);
  return {h.n_head / P, h.n_kv_head >= P ? h.n_kv_head / P : 1, h.head_dim};
}

}  // namespace

UlyssesAttention::UlyssesAttention(Communicator& group, const ContextSplit& split,
                                   const ContextHeads& heads, int seq_len, DType compute,
                                   int ring_size)
    : group_(group),
      split_(split),
      heads_(heads),
      local_(heads_per_rank(group.size(), heads)),
      P_(group.size()),
      ring_size_(ring_size),
      T_(seq_len),
      Tl_(seq_len / (group.size() * ring_size)),
      replicated_kv_(heads.n_kv_head < group.size()),
      compute_(compute) {
  SHARDLM_CHECK(split.size() == P_ * ring_size && (ring_size > 1 || split.chunks_per_row() == P_),
                "internal: Ulysses attention over {} ranks on a split into {} chunks", P_,
                split.chunks_per_row());
  split.check_seq_len(seq_len);
}

int UlyssesAttention::first_kv_head(int rank) const {
  return replicated_kv_ ? rank / (P_ / heads_.n_kv_head) : rank * local_.n_kv_head;
}

AttentionShape UlyssesAttention::local_shape(int B) const {
  return {B, gathered_len(), local_.n_head, local_.n_kv_head, local_.head_dim};
}

void UlyssesAttention::carve(ArenaCarver& carver, int slots, int max_batch) {
  max_batch_ = max_batch;
  const int64_t rows = static_cast<int64_t>(max_batch) * (T_ / ring_size_);  // gathered rows
  saved_.assign(static_cast<size_t>(slots), Saved{});
  for (Saved& s : saved_) {
    carver.request(&s.qkv, compute_, rows * local_.qkv_columns());
    carver.request(&s.out, compute_, rows * local_.q_columns());
    if (ring_size_ == 1) carver.request(&s.lse, rows * local_.n_head);  // hybrid: the ring's
  }
  // P blocks of B x local T rows: as many elements as the whole rows of this rank's heads.
  carver.request(&send_, rows * local_.qkv_columns());
  carver.request(&recv_, rows * local_.qkv_columns());
  carver.request(&drows_, rows * local_.q_columns());
  carver.request(&dqkv_rows_, rows * local_.qkv_columns());
  if (replicated_kv_) {
    const int64_t local_rows = static_cast<int64_t>(max_batch) * Tl_;
    carver.request(&kv_sum_, local_rows * 2 * heads_.head_dim);
    carver.request(&kv_part_, local_rows * 2 * heads_.head_dim);
  }
  if (ring_size_ == 1) carver.request(&key_begin_, rows);
}

void UlyssesAttention::begin_micro_batch(Backend& backend) {
  const int32_t* full = split_.full_key_begin();
  SHARDLM_CHECK(split_.full_len() <= T_, "internal: Ulysses attention for rows of {} tokens got {}",
                T_, split_.full_len());
  SHARDLM_CHECK(split_.local().B <= max_batch_, "internal: {} rows, Ulysses attention has room for {}",
                split_.local().B, max_batch_);
  // Under hybrid attention the ring reads key_begin itself (its blocks' key ranges).
  if (full == nullptr || backend.device().is_host() || ring_size_ > 1) {
    key_begin_view_ = full;
    return;
  }
  backend.copy_from_host(key_begin_, full,
                         sizeof(int32_t) * static_cast<size_t>(split_.local().B) *
                             static_cast<size_t>(split_.full_len()));
  key_begin_view_ = key_begin_;
}

void UlyssesAttention::move_rows(Backend& be, TypedPtr rows, TypedPtr packed, int64_t width,
                                 int B, bool to_rows) {
  const int64_t T = gathered_len(), Tl = T / P_;
  const int64_t block = static_cast<int64_t>(B) * Tl * width;
  for (int j = 0; j < P_; ++j)
    for (int b = 0; b < B; ++b) {
      const TypedPtr in_rows = rows.at((b * T + j * Tl) * width);
      const TypedPtr in_block = packed.at(j * block + b * Tl * width);
      if (to_rows)
        be.convert_rows(in_rows, width, in_block, width, Tl, width);
      else
        be.convert_rows(in_block, width, in_rows, width, Tl, width);
    }
}

void UlyssesAttention::forward(int slot, Backend& be, ConstTypedPtr qkv, TypedPtr out, int B) {
  Saved& s = saved_.at(static_cast<size_t>(slot));
  gather_heads(slot, be, qkv, B);
  be.attention_forward(s.out, s.lse, s.qkv, local_shape(B), key_begin_view_);
  scatter_output(slot, be, out, B);
}

TypedPtr UlyssesAttention::gather_heads(int slot, Backend& be, ConstTypedPtr qkv, int B) {
  Saved& s = saved_.at(static_cast<size_t>(slot));
  const int64_t n = static_cast<int64_t>(B) * (gathered_len() / P_);  // this rank's tokens
  const int64_t hd = heads_.head_dim, QKV = heads_.qkv_columns(), Q = heads_.q_columns();
  const int64_t lq = local_.q_columns(), lkv = local_.kv_columns(), lqkv = local_.qkv_columns();
  const TypedPtr send(send_, compute_), recv(recv_, compute_);
  // Block j: rank j's heads of this rank's tokens, each row q | k | v as the kernel reads it.
  const int64_t block = n * lqkv;
  for (int j = 0; j < P_; ++j) {
    const int64_t kv = first_kv_head(j) * hd;
    be.convert_rows(send.at(j * block), lqkv, qkv.at(j * lq), QKV, n, lq);
    be.convert_rows(send.at(j * block + lq), lqkv, qkv.at(Q + kv), QKV, n, lkv);
    be.convert_rows(send.at(j * block + lq + lkv), lqkv, qkv.at(Q + heads_.kv_columns() + kv), QKV, n,
                    lkv);
  }
  group_.all_to_all(send, recv, static_cast<size_t>(block), "ulysses q|k|v").wait();
  move_rows(be, s.qkv, recv, lqkv, B, /*to_rows=*/true);
  return s.qkv;
}

void UlyssesAttention::scatter_output(int slot, Backend& be, TypedPtr out, int B) {
  const Saved& s = saved_.at(static_cast<size_t>(slot));
  const int64_t n = static_cast<int64_t>(B) * (gathered_len() / P_);
  const int64_t Q = heads_.q_columns(), lq = local_.q_columns();
  const TypedPtr send(send_, compute_), recv(recv_, compute_);
  // Back: block j holds rank j's tokens of this rank's heads.
  const int64_t out_block = n * lq;
  move_rows(be, s.out, send, lq, B, /*to_rows=*/false);
  group_.all_to_all(send, recv, static_cast<size_t>(out_block), "ulysses attention output").wait();
  for (int j = 0; j < P_; ++j) be.convert_rows(out.at(j * lq), Q, recv.at(j * out_block), lq, n, lq);
}

void UlyssesAttention::backward(int slot, Backend& be, const float* dout, float* dqkv, int B) {
  const Saved& s = saved_.at(static_cast<size_t>(slot));
  gather_output_gradient(be, dout, B);
  be.attention_backward(dqkv_rows_, drows_, s.qkv, s.out, s.lse, local_shape(B), key_begin_view_);
  scatter_qkv_gradient(be, dqkv, B);
}

float* UlyssesAttention::gather_output_gradient(Backend& be, const float* dout, int B) {
  const int64_t n = static_cast<int64_t>(B) * (gathered_len() / P_);
  const int64_t Q = heads_.q_columns(), lq = local_.q_columns();
  const TypedPtr send(send_), recv(recv_);
  // The output's gradient to the ranks of its heads (the forward's second exchange reversed).
  const int64_t out_block = n * lq;
  for (int j = 0; j < P_; ++j) be.convert_rows(send.at(j * out_block), lq, ConstTypedPtr(dout).at(j * lq), Q, n, lq);
  group_.all_to_all(send, recv, static_cast<size_t>(out_block), "ulysses attention output gradient").wait();
  move_rows(be, drows_, recv, lq, B, /*to_rows=*/true);
  return drows_;
}

void UlyssesAttention::scatter_qkv_gradient(Backend& be, float* dqkv, int B) {
  const int64_t n = static_cast<int64_t>(B) * (gathered_len() / P_);
  const int64_t hd = heads_.head_dim, QKV = heads_.qkv_columns(), Q = heads_.q_columns();
  const int64_t lq = local_.q_columns(), lkv = local_.kv_columns(), lqkv = local_.qkv_columns();
  const TypedPtr send(send_), recv(recv_);
  // q|k|v's gradient back to the ranks of its tokens (the first exchange reversed).
  const int64_t block = n * lqkv;
  move_rows(be, dqkv_rows_, send, lqkv, B, /*to_rows=*/false);
  group_.all_to_all(send, recv, static_cast<size_t>(block), "ulysses q|k|v gradient").wait();
  const TypedPtr dst(dqkv);
  const int64_t KVD = heads_.kv_columns();
  for (int j = 0; j < P_; ++j) {
    be.convert_rows(dst.at(j * lq), QKV, recv.at(j * block), lqkv, n, lq);
    if (replicated_kv_) continue;
    const int64_t kv = first_kv_head(j) * hd;
    be.convert_rows(dst.at(Q + kv), QKV, recv.at(j * block + lq), lqkv, n, lkv);
    be.convert_rows(dst.at(Q + KVD + kv), QKV, recv.at(j * block + lq + lkv), lqkv, n, lkv);
  }
  if (!replicated_kv_) return;
  // Each KV head's k | v gradient is the sum over the P / KV ranks that held it.
  const int per_head = P_ / heads_.n_kv_head;
  const TypedPtr sum(kv_sum_), part(kv_part_);
  for (int k = 0; k < heads_.n_kv_head; ++k) {
    for (int j = k * per_head; j < (k + 1) * per_head; ++j) {
      const TypedPtr into = j == k * per_head ? sum : part;
      be.convert_rows(into, 2 * hd, recv.at(j * block + lq), lqkv, n, 2 * hd);
      if (j != k * per_head) be.accumulate(kv_sum_, kv_part_, n * 2 * hd);
    }
    be.convert_rows(dst.at(Q + k * hd), QKV, sum, 2 * hd, n, hd);
    be.convert_rows(dst.at(Q + KVD + k * hd), QKV, sum.at(hd), 2 * hd, n, hd);
  }
}

}  // namespace shardlm
