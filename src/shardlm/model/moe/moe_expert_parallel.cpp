// Expert parallelism of MoeExperts: the token exchange around the held experts
// (dispatch, combine and their backward), as moe_experts.hpp describes it.
#include <algorithm>
#include <cstring>
#include <string>

#include "shardlm/core/error.hpp"
#include "shardlm/model/moe/moe_experts.hpp"

namespace shardlm {

namespace {

void wait_all(std::vector<Work>& works) {
  for (Work& w : works) w.wait();
  works.clear();
}

}  // namespace

void MoeExperts::ep_carve(ArenaCarver& carver, int64_t n) {
  const DType ct = compute_;
  const int P = group_->size();
  const int64_t nk = n * k_;
  // A source sends a held expert each of its tokens at most once, so at most
  // min(k, E/P) of its rows per token come here: the buffers hold that worst routing
  // (P times the n k rows of balanced routing when k <= E/P). The meta device sizes
  // them the same, so plan's activations are the run's; its balanced routing (every
  // holder n k / P rows from each of the P sources) fills n k of them.
  ep_capacity_ = P * n * std::min<int64_t>(k_, local_experts_);
  const int64_t R = ep_capacity_;
  const auto request_held = [&](HeldRows& held) {
    carver.request(&held.h2, ct, R * C_);
    carver.request(&held.gate_up, ct, R * 2 * I_);
    carver.request(&held.act, ct, R * I_);
  };
  if (recompute_) request_held(shared_held_);
  for (LayerRouting& l : layers_) {
    l.received.assign(static_cast<size_t>(P) * static_cast<size_t>(local_experts_), 0);
    if (!recompute_) request_held(l.held);
  }
  carver.request(&ep_send_h2_, ct, nk * C_);
  carver.request(&ep_rows_, R * C_);
  carver.request(&ep_back_, nk * C_);
  carver.request(&ep_dy_, R * C_);
  carver.request(&ep_send_w_, nk);
  carver.request(&ep_w_, R);
  carver.request(&ep_dot_, R);
  carver.request(&ep_dot_back_, nk);
  carver.request(&ep_counts_, 2 * static_cast<int64_t>(E_));
}

int64_t MoeExperts::received_rows(const LayerRouting& r, int peer, int local) const {
  return r.received[static_cast<size_t>(peer) * static_cast<size_t>(local_experts_) +
                    static_cast<size_t>(local)];
}

int MoeExperts::chunk_begin(int chunk) const {
  return static_cast<int>(static_cast<int64_t>(chunk) * local_experts_ / chunks_);
}

int MoeExperts::chunk_of(int local) const {
  int chunk = 0;
  while (chunk_begin(chunk + 1) <= local) ++chunk;
  return chunk;
}

int64_t MoeExperts::received_begin(const LayerRouting& r, int peer, int local) const {
  // Chunk-major, then source-major: every source's rows for the earlier chunks' held
  // experts, then the earlier sources' rows for this chunk's, then peer's for this
  // chunk's experts before `local`.
  const int chunk = chunk_of(local);
  int64_t begin = 0;
  for (int e = 0; e < chunk_begin(chunk); ++e)
    for (int j = 0; j < group_->size(); ++j) begin += received_rows(r, j, e);
  for (int j = 0; j <= peer; ++j)
    for (int e = chunk_begin(chunk); e < (j == peer ? local : chunk_begin(chunk + 1)); ++e)
      begin += received_rows(r, j, e);
  return begin;
}

std::vector<int64_t> MoeExperts::sent_begin(const LayerRouting& r) const {
  std::vector<int64_t> begin(static_cast<size_t>(E_));
  int64_t row = 0;
  for (int chunk = 0; chunk < chunks_; ++chunk)
    for (int p = 0; p < group_->size(); ++p)
      for (int e = chunk_begin(chunk); e < chunk_begin(chunk + 1); ++e) {
        const int x = p * local_experts_ + e;
        begin[static_cast<size_t>(x)] = row;
        const auto [first, last] = assignments(r, x);
        row += last - first;
      }
  return begin;
}

Work MoeExperts::exchange_chunk(const LayerRouting& r, const std::vector<int64_t>& sent, int chunk,
                                Direction direction, ConstTypedPtr from, TypedPtr to,
                                int64_t width, const char* what) {
  const int first = chunk_begin(chunk);
  std::vector<size_t> at_sources, at_holders;  // elements per peer
  for (int p = 0; p < group_->size(); ++p) {
    int64_t sent_rows = 0, received = 0;
    for (int e = first; e < chunk_begin(chunk + 1); ++e) {
      const auto [begin, end] = assignments(r, p * local_experts_ + e);
      sent_rows += end - begin;
      received += received_rows(r, p, e);
    }
    at_sources.push_back(static_cast<size_t>(sent_rows * width));
    at_holders.push_back(static_cast<size_t>(received * width));
  }
  // The chunk's first rows: peer 0's first expert of the chunk in the send layout,
  // source 0's rows for the chunk's first held expert among the received ones.
  const int64_t source_row = sent[static_cast<size_t>(first)];
  const int64_t held_row = received_begin(r, 0, first);
  std::string label = std::string(what) + " " + std::to_string(chunk);
  if (direction == Direction::to_holders)
    return group_->all_to_all_v(from.at(source_row * width), at_sources, to.at(held_row * width),
                                at_holders, std::move(label));
  return group_->all_to_all_v(from.at(held_row * width), at_holders, to.at(source_row * width),
                              at_sources, std::move(label));
}

void MoeExperts::dispatch(int l, Backend& be, ConstTypedPtr h2) {
  if (!parallel()) return;
  LayerRouting& r = layer(l);
  const int P = group_->size();
  const int64_t nk = n_ * k_;
  // The counts first: E/P per peer, each the rows this rank routes to that expert
  // (made on the host, exchanged in the group's memory, read back on the host).
  std::vector<float> counts(2 * static_cast<size_t>(E_), 0.0f);
  if (!meta_)
    for (int e = 0; e < E_; ++e) {
      const auto [begin, end] = assignments(r, e);
      counts[static_cast<size_t>(e)] = static_cast<float>(end - begin);
    }
  const size_t count_bytes = sizeof(float) * static_cast<size_t>(E_);
  be.copy_from_host(ep_counts_, counts.data(), count_bytes);
  group_->all_to_all(ConstTypedPtr(ep_counts_), TypedPtr(ep_counts_ + E_),
                     static_cast<size_t>(local_experts_), "expert dispatch counts")
      .wait();
  be.copy_to_host(counts.data() + E_, ep_counts_ + E_, count_bytes);
  int64_t total = 0;
  for (int j = 0; j < P; ++j)
    for (int e = 0; e < local_experts_; ++e) {
      // The meta device: every source routes as balanced as meta_begin_ does.
      const int global = local_begin_ + e;
      const int64_t rows = meta_ ? nk * (global + 1) / E_ - nk * global / E_
                                 : static_cast<int64_t>(counts[static_cast<size_t>(E_ + j * local_experts_ + e)]);
      r.received[static_cast<size_t>(j * local_experts_ + e)] = rows;
      total += rows;
    }
  SHARDLM_CHECK(total <= ep_capacity_,
                "internal: expert dispatch receives {} rows, the buffers hold {}", total,
                ep_capacity_);
  // One exchange per chunk, in the order the holders run them: the first chunk's
  // GEMMs start while the later chunks' rows travel.
  const std::vector<int64_t> sent = sent_begin(r);
  pack_h2_rows(r, be, h2, sent);
  arriving_.assign(static_cast<size_t>(chunks_), {});
  returning_.assign(static_cast<size_t>(chunks_), {});
  for (int chunk = 0; chunk < chunks_; ++chunk)
    arriving_[static_cast<size_t>(chunk)].push_back(
        exchange_chunk(r, sent, chunk, Direction::to_holders, ep_send_h2_, held_rows(r).h2, C_,
                       "expert dispatch"));
}

void MoeExperts::pack_h2_rows(LayerRouting& r, Backend& be, ConstTypedPtr h2,
                              const std::vector<int64_t>& sent) {
  for (int x = 0; x < E_; ++x) {
    const auto [begin, end] = assignments(r, x);
    be.gather_rows(ep_send_h2_.at(sent[static_cast<size_t>(x)] * C_), h2, r.routing.token + begin,
                   end - begin, C_);
  }
}

void MoeExperts::held_activations(LayerRouting& r, int local, int peer, Backend& be,
                                  bool row_by_row, const ExpertWeights& w) {
  const int64_t rows = received_rows(r, peer, local);
  const int64_t b = received_begin(r, peer, local);
  const int m = static_cast<int>(rows), c = static_cast<int>(C_), i1 = static_cast<int>(I_);
  const HeldRows& held = held_rows(r);
  const TypedPtr gate_up = held.gate_up.at(b * 2 * I_);
  float* gu_f = compute_ == DType::fp32 ? gate_up.f32() : gu_f_;
  forward_gemm(be, row_by_row, true, m, 2 * i1, c, 1.0f, held.h2.at(b * C_), c, w.gate_up, c,
               0.0f, gu_f, 2 * i1);
  if (w.lora.gate_up.targeted())
    lora_->forward(be, row_by_row, w.lora.gate_up, m, c, 2 * i1, held.h2.at(b * C_), gu_f, 2 * i1);
  be.swiglu_forward(held.act.at(b * I_), gate_up, gu_f, rows, i1);
}

void MoeExperts::ep_expert_forward(LayerRouting& r, int e, Backend& be, bool row_by_row,
                                   const ExpertWeights& w, float* out) {
  const int c = static_cast<int>(C_), i1 = static_cast<int>(I_);
  if (holds(e)) {
    const int local = e - local_begin_;
    const int chunk = chunk_of(local);
    wait_all(arriving_[static_cast<size_t>(chunk)]);
    for (int j = 0; j < group_->size(); ++j) {
      const int64_t rows = received_rows(r, j, local);
      if (rows == 0) continue;
      const int64_t b = received_begin(r, j, local);
      const int m = static_cast<int>(rows);
      held_activations(r, local, j, be, row_by_row, w);
      const TypedPtr act = held_rows(r).act.at(b * I_);
      forward_gemm(be, row_by_row, true, m, c, i1, 1.0f, act, i1, w.down, i1, 0.0f,
                   ep_rows_ + b * C_, c);
      if (w.lora.down.targeted())
        lora_->forward(be, row_by_row, w.lora.down, m, i1, c, act, ep_rows_ + b * C_, c);
    }
    // After the chunk's last expert, its outputs start back while the next chunk
    // computes.
    if (local + 1 == chunk_begin(chunk + 1))
      returning_[static_cast<size_t>(chunk)].push_back(
          exchange_chunk(r, sent_begin(r), chunk, Direction::to_sources, ep_rows_, ep_back_, C_,
                         "expert combine"));
  }
  if (e != E_ - 1) return;
  // Combine: the outputs back at their sources, added in expert order as at P = 1.
  for (auto& works : returning_) wait_all(works);
  const std::vector<int64_t> sent = sent_begin(r);
  for (int x = 0; x < E_; ++x) {
    const auto [begin, end] = assignments(r, x);
    const int64_t row = sent[static_cast<size_t>(x)];
    be.moe_assignment_weights(ep_send_w_ + row, r.routing.top_weight, r.routing.token + begin,
                              r.routing.slot + begin, k_, end - begin);
    be.scatter_add_rows(out, ep_back_ + row * C_, r.routing.token + begin, ep_send_w_ + row,
                        end - begin, C_);
  }
}

void MoeExperts::ep_expert_backward(LayerRouting& r, int e, Backend& be,
                                    const ParamRounding& rounding, ConstTypedPtr h2,
                                    const ExpertWeights& w, const float* dy,
                                    float* grad_gate_up, float* grad_down) {
  const int64_t nk = n_ * k_;
  if (e == E_ - 1) {  // the layer's first backward expert unit: dy rows to the holders
    // (recompute: the h2 rows again first, into the shared set the forward's later
    // layers overwrote; every rank of the group starts the same exchanges in order)
    const std::vector<int64_t> sent = sent_begin(r);
    if (recompute_) pack_h2_rows(r, be, h2, sent);
    be.fill_zero(dh2_, sizeof(float) * static_cast<size_t>(n_ * C_));
    be.fill_zero(dtop_, sizeof(float) * static_cast<size_t>(nk));
    for (int x = 0; x < E_; ++x) {
      const auto [begin, end] = assignments(r, x);
      const int64_t row = sent[static_cast<size_t>(x)];
      be.gather_rows(TypedPtr(ep_back_ + row * C_), ConstTypedPtr(dy), r.routing.token + begin,
                     end - begin, C_);
      be.moe_assignment_weights(ep_send_w_ + row, r.routing.top_weight, r.routing.token + begin,
                                r.routing.slot + begin, k_, end - begin);
    }
    // One set of exchanges per chunk, in the order the holders run them backward (the
    // last first), so that each chunk's backward starts once its own rows are in.
    arriving_.assign(static_cast<size_t>(chunks_), {});
    returning_.assign(static_cast<size_t>(chunks_), {});
    for (int chunk = chunks_ - 1; chunk >= 0; --chunk) {
      std::vector<Work>& in = arriving_[static_cast<size_t>(chunk)];
      if (recompute_)
        in.push_back(exchange_chunk(r, sent, chunk, Direction::to_holders, ep_send_h2_,
                                    held_rows(r).h2, C_, "expert dispatch h2 again"));
      in.push_back(exchange_chunk(r, sent, chunk, Direction::to_holders, ep_back_, ep_dy_, C_,
                                  "expert dispatch dy"));
      in.push_back(exchange_chunk(r, sent, chunk, Direction::to_holders, ep_send_w_, ep_w_, 1,
                                  "expert dispatch weights"));
    }
  }
  const int c = static_cast<int>(C_), i1 = static_cast<int>(I_);
  if (holds(e)) {
    const int local = e - local_begin_;
    const int chunk = chunk_of(local);
    // (Its dy rows' exchange, whose sent half reads ep_back_, is done before its dh2
    // rows come back into the same rows of ep_back_.)
    wait_all(arriving_[static_cast<size_t>(chunk)]);
    const HeldRows& held = held_rows(r);
    for (int j = 0; j < group_->size(); ++j) {
      const int64_t rows = received_rows(r, j, local);
      if (rows == 0) continue;
      const int64_t b = received_begin(r, j, local);
      const int m = static_cast<int>(rows);
      if (recompute_) held_activations(r, local, j, be, /*row_by_row=*/false, w);
      const TypedPtr gate_up = held.gate_up.at(b * 2 * I_);
      const TypedPtr act = held.act.at(b * I_);
      // As expert_backward at P = 1 on the source's block: g = dy_e Wdown
      // (unweighted), the weight's gradient <g, silu(gate) * up>, the rest weighted.
      be.copy(out_, ep_dy_ + b * C_, sizeof(float) * static_cast<size_t>(rows * C_));
      const ConstTypedPtr dy_e = rounding.for_gemm(out_, out_c_, rows * C_);
      be.gemm(false, false, m, i1, c, 1.0f, dy_e, c, w.down, i1, 0.0f, g_, i1);
      if (w.lora.down.targeted()) lora_->input_gradient(be, w.lora.down, m, i1, c, dy_e, g_);
      float* act_f = dgu_;  // act as fp32, before dgu_ is written
      be.convert_rows(act_f, I_, act, I_, rows, I_);
      be.moe_weight_backward(ep_dot_ + b, g_, act_f, I_, out_, C_, ep_w_ + b, rows);
      if (grad_down != nullptr || w.lora.down.targeted()) {
        const ConstTypedPtr dyw = rounding.for_gemm(out_, out_c_, rows * C_);
        if (grad_down != nullptr) be.gemm(true, false, c, i1, m, 1.0f, dyw, c, act, i1, 1.0f, grad_down, i1);
        if (w.lora.down.targeted()) lora_->weight_gradients(be, w.lora.down, m, i1, c, act, dyw);
      }
      be.swiglu_backward(dgu_, g_, gate_up, rows, i1);
      const ConstTypedPtr dgu = rounding.for_gemm(dgu_, dgu_c_, rows * 2 * I_);
      const ConstTypedPtr x = held.h2.at(b * C_);
      if (grad_gate_up != nullptr)
        be.gemm(true, false, 2 * i1, c, m, 1.0f, dgu, 2 * i1, x, c, 1.0f, grad_gate_up, c);
      be.gemm(false, false, m, c, 2 * i1, 1.0f, dgu, 2 * i1, w.gate_up, c, 0.0f, ep_rows_ + b * C_,
              c);
      if (w.lora.gate_up.targeted()) {
        lora_->weight_gradients(be, w.lora.gate_up, m, c, 2 * i1, x, dgu);
        lora_->input_gradient(be, w.lora.gate_up, m, c, 2 * i1, dgu, ep_rows_ + b * C_);
      }
    }
    // After the chunk's last backward expert (its first), its dh2 rows and the top-k
    // weights' gradients start back while the next chunk computes.
    if (local == chunk_begin(chunk)) {
      const std::vector<int64_t> sent = sent_begin(r);
      std::vector<Work>& out = returning_[static_cast<size_t>(chunk)];
      out.push_back(exchange_chunk(r, sent, chunk, Direction::to_sources, ep_rows_, ep_back_, C_,
                                   "expert combine dh2"));
      out.push_back(exchange_chunk(r, sent, chunk, Direction::to_sources, ep_dot_, ep_dot_back_,
                                   1, "expert combine weights' gradients"));
    }
  }
  if (e != 0) return;
  // The layer's last backward expert unit: dh2 rows and the weights' gradients are
  // back; added in the P = 1 order (experts descending).
  for (auto& works : returning_) wait_all(works);
  const std::vector<int64_t> sent = sent_begin(r);
  for (int x = E_ - 1; x >= 0; --x) {
    const auto [begin, end] = assignments(r, x);
    if (end == begin) continue;
    const int64_t row = sent[static_cast<size_t>(x)];
    const int32_t* tokens = r.routing.token + begin;
    be.moe_scatter_weight_grads(dtop_, ep_dot_back_ + row, tokens, r.routing.slot + begin, k_,
                                end - begin);
    be.scatter_add_rows(dh2_, ep_back_ + row * C_, tokens, nullptr, end - begin, C_);
  }
}

}  // namespace shardlm
