// Expert parallelism of MoeExperts: the token exchange around the held experts
// (dispatch, combine and their backward), as moe_experts.hpp describes it.
#include <algorithm>
#include <cstring>

#include "shardlm/core/error.hpp"
#include "shardlm/model/moe/moe_experts.hpp"

namespace shardlm {

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

int64_t MoeExperts::received_begin(const LayerRouting& r, int peer, int local) const {
  const size_t end = static_cast<size_t>(peer) * static_cast<size_t>(local_experts_) +
                     static_cast<size_t>(local);
  int64_t begin = 0;
  for (size_t i = 0; i < end; ++i) begin += r.received[i];
  return begin;
}

std::vector<size_t> MoeExperts::sent_counts(const LayerRouting& r, int64_t width) const {
  std::vector<size_t> counts;
  for (int p = 0; p < group_->size(); ++p) {
    const int64_t first = assignments(r, p * local_experts_).first;
    const int64_t last = assignments(r, (p + 1) * local_experts_ - 1).second;
    counts.push_back(static_cast<size_t>((last - first) * width));
  }
  return counts;
}

std::vector<size_t> MoeExperts::received_counts(const LayerRouting& r, int64_t width) const {
  std::vector<size_t> counts;
  for (int j = 0; j < group_->size(); ++j) {
    int64_t rows = 0;
    for (int e = 0; e < local_experts_; ++e) rows += received_rows(r, j, e);
    counts.push_back(static_cast<size_t>(rows * width));
  }
  return counts;
}

void MoeExperts::dispatch(int l, Backend& be, ConstTypedPtr h2) {
  if (!parallel()) return;
  LayerRouting& r = layer(l);
  const int P = group_->size();
  const int64_t nk = n_ * k_;
  // The counts first: E/P per peer, each the rows this rank routes to that expert.
  if (!meta_)
    for (int e = 0; e < E_; ++e) {
      const auto [begin, end] = assignments(r, e);
      ep_counts_[e] = static_cast<float>(end - begin);
    }
  group_->all_to_all(ConstTypedPtr(ep_counts_), TypedPtr(ep_counts_ + E_),
                     static_cast<size_t>(local_experts_), "expert dispatch counts")
      .wait();
  int64_t total = 0;
  for (int j = 0; j < P; ++j)
    for (int e = 0; e < local_experts_; ++e) {
      // The meta device: every source routes as balanced as meta_begin_ does.
      const int global = local_begin_ + e;
      const int64_t rows = meta_ ? nk * (global + 1) / E_ - nk * global / E_
                                 : static_cast<int64_t>(ep_counts_[E_ + j * local_experts_ + e]);
      r.received[static_cast<size_t>(j * local_experts_ + e)] = rows;
      total += rows;
    }
  SHARDLM_CHECK(total <= ep_capacity_,
                "internal: expert dispatch receives {} rows, the buffers hold {}", total,
                ep_capacity_);
  send_h2_rows(r, be, h2).wait();
}

Work MoeExperts::send_h2_rows(LayerRouting& r, Backend& be, ConstTypedPtr h2) {
  // Each assignment's h2 row, in the grouping order: peer p's block is its experts'.
  const int64_t nk = n_ * k_;
  if (meta_) {
    be.convert_rows(ep_send_h2_, C_, h2, C_, nk, C_);  // the same bytes
  } else {
    for (int64_t i = 0; i < nk; ++i)
      be.convert_rows(ep_send_h2_.at(i * C_), C_,
                      h2.at(static_cast<int64_t>(r.routing.token[i]) * C_), C_, 1, C_);
  }
  return group_->all_to_all_v(ep_send_h2_, sent_counts(r, C_), held_rows(r).h2,
                              received_counts(r, C_), "expert dispatch");
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
  }
  if (e != E_ - 1) return;
  // Combine: the outputs back to their sources, added in expert order as at P = 1.
  group_->all_to_all_v(ConstTypedPtr(ep_rows_), received_counts(r, C_), TypedPtr(ep_back_),
                       sent_counts(r, C_), "expert combine")
      .wait();
  if (meta_) return;
  for (int x = 0; x < E_; ++x) {
    const auto [begin, end] = assignments(r, x);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = r.routing.token[i];
      const float weight = r.routing.top_weight[t * k_ + r.routing.slot[i]];
      float* y = out + t * C_;
      const float* o = ep_back_ + i * C_;
      for (int64_t j = 0; j < C_; ++j) y[j] += weight * o[j];
    }
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
    Work h2_rows = recompute_ ? send_h2_rows(r, be, h2) : Work();
    be.fill_zero(dh2_, sizeof(float) * static_cast<size_t>(n_ * C_));
    be.fill_zero(dtop_, sizeof(float) * static_cast<size_t>(nk));
    if (!meta_)
      for (int64_t i = 0; i < nk; ++i) {
        const int64_t t = r.routing.token[i];
        std::copy_n(dy + t * C_, C_, ep_back_ + i * C_);
        ep_send_w_[i] = r.routing.top_weight[t * k_ + r.routing.slot[i]];
      }
    Work rows = group_->all_to_all_v(ConstTypedPtr(ep_back_), sent_counts(r, C_),
                                     TypedPtr(ep_dy_), received_counts(r, C_), "expert dispatch dy");
    Work weights = group_->all_to_all_v(ConstTypedPtr(ep_send_w_), sent_counts(r, 1),
                                        TypedPtr(ep_w_), received_counts(r, 1),
                                        "expert dispatch weights");
    h2_rows.wait();
    rows.wait();
    weights.wait();
  }
  const int c = static_cast<int>(C_), i1 = static_cast<int>(I_);
  if (holds(e)) {
    const int local = e - local_begin_;
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
      if (!meta_) std::copy_n(ep_dy_ + b * C_, rows * C_, out_);
      const ConstTypedPtr dy_e = rounding.for_gemm(out_, out_c_, rows * C_);
      be.gemm(false, false, m, i1, c, 1.0f, dy_e, c, w.down, i1, 0.0f, g_, i1);
      if (w.lora.down.targeted()) lora_->input_gradient(be, w.lora.down, m, i1, c, dy_e, g_);
      if (!meta_) {
        float* act_f = dgu_;  // act as fp32, before dgu_ is written
        be.convert_rows(act_f, I_, act, I_, rows, I_);
        for (int64_t i = 0; i < rows; ++i) {
          const float weight = ep_w_[b + i];
          float dot = 0;
          for (int64_t x = 0; x < I_; ++x) dot += g_[i * I_ + x] * act_f[i * I_ + x];
          ep_dot_[b + i] = dot;
          for (int64_t x = 0; x < I_; ++x) g_[i * I_ + x] *= weight;
          for (int64_t x = 0; x < C_; ++x) out_[i * C_ + x] *= weight;
        }
      }
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
  }
  if (e != 0) return;
  // The layer's last backward expert unit: dh2 rows and the weights' gradients back,
  // added in the P = 1 order (experts descending).
  Work rows = group_->all_to_all_v(ConstTypedPtr(ep_rows_), received_counts(r, C_),
                                   TypedPtr(ep_back_), sent_counts(r, C_), "expert combine dh2");
  Work dots = group_->all_to_all_v(ConstTypedPtr(ep_dot_), received_counts(r, 1),
                                   TypedPtr(ep_dot_back_), sent_counts(r, 1),
                                   "expert combine weights' gradients");
  rows.wait();
  dots.wait();
  if (meta_) return;
  for (int x = E_ - 1; x >= 0; --x) {
    const auto [begin, end] = assignments(r, x);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = r.routing.token[i];
      dtop_[t * k_ + r.routing.slot[i]] += ep_dot_back_[i];
      float* d = dh2_ + t * C_;
      const float* dx = ep_back_ + i * C_;
      for (int64_t j = 0; j < C_; ++j) d[j] += dx[j];
    }
  }
}

}  // namespace shardlm
