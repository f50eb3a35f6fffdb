#include "shardlm/model/moe/moe_experts.hpp"

#include <algorithm>
#include <span>

#include "shardlm/core/error.hpp"
#include "shardlm/model/llama/llama_lora.hpp"

namespace shardlm {

MoeExperts::MoeExperts(const ModelConfig& c, DType compute, bool meta, bool recompute,
                       Communicator* expert_group, bool on_device, int exchange_chunks)
    : E_(c.moe.num_experts),
      k_(c.moe.top_k),
      C_(c.n_embd),
      I_(c.moe.expert_intermediate_size),
      norm_topk_(c.moe.norm_topk_prob),
      compute_(compute),
      meta_(meta),
      recompute_(recompute),
      on_device_(on_device && !meta) {
  int sparse = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const bool is_sparse = c.moe.sparse_layer(l);
    sparse_index_.push_back(is_sparse ? sparse++ : -1);
    if (is_sparse && first_sparse_ < 0) first_sparse_ = l;
  }
  layers_.resize(static_cast<size_t>(sparse));
  stats_.reset(E_);
  if (llama_expert_lora(c)) lora_ = std::make_unique<ExpertLora>(c.lora.rank, c.lora.scale(), compute);
  local_experts_ = E_;
  if (expert_group != nullptr && expert_group->size() > 1) {
    const int P = expert_group->size();
    SHARDLM_CHECK(E_ % P == 0,
                  "--expert-parallel {}: the model has {} experts per layer, which {} ranks cannot "
                  "share equally (expected a divisor of {})", P, E_, P, E_);
    group_ = expert_group;
    local_experts_ = E_ / P;
    local_begin_ = expert_group->rank() * local_experts_;
    SHARDLM_CHECK(exchange_chunks >= 0, "internal: expert exchange chunks {} below 0",
                  exchange_chunks);
    // ModelOptions::expert_exchange_chunks: by default one per held expert on a device,
    // one on the host.
    chunks_ = exchange_chunks == 0 ? (on_device ? local_experts_ : 1)
                                   : std::min(exchange_chunks, local_experts_);
  }
}

void MoeExperts::carve(ArenaCarver& carver, int64_t n) {
  const DType ct = compute_;
  const int64_t nk = n * k_;
  for (LayerRouting& l : layers_) {
    carver.request(&l.routing.probs, n * E_);
    carver.request(&l.routing.top_expert, nk);
    carver.request(&l.routing.top_weight, nk);
    carver.request(&l.routing.expert_begin, E_ + 1);
    carver.request(&l.routing.token, nk);
    carver.request(&l.routing.slot, nk);
    if (on_device_) l.host_begin.assign(static_cast<size_t>(E_) + 1, 0);
    if (recompute_) {
      carver.request(&l.kept_h2, ct, n * C_);
    } else if (!parallel()) {  // expert parallelism keeps its own (ep_carve)
      carver.request(&l.gate_up, ct, nk * 2 * I_);
      carver.request(&l.act, ct, nk * I_);
    }
  }
  if (recompute_ && !parallel()) {  // (expert parallelism: its shared set, ep_carve)
    carver.request(&shared_gate_up_, ct, n * 2 * I_);
    carver.request(&shared_act_, ct, n * I_);
  }
  carver.request(&logits_, n * E_);
  carver.request(&xe_, ct, n * C_);
  if (ct != DType::fp32) {
    carver.request(&gu_f_, n * 2 * I_);
    carver.request(&out_c_, ct, n * C_);
    carver.request(&dgu_c_, ct, n * 2 * I_);
    carver.request(&dlogits_c_, ct, n * E_);
  }
  carver.request(&out_, n * C_);
  carver.request(&g_, n * I_);
  carver.request(&dgu_, n * 2 * I_);
  carver.request(&dx_, n * C_);
  carver.request(&dh2_, n * C_);
  carver.request(&dtop_, nk);
  carver.request(&dlogits_, n * E_);
  carver.request(&aux_dprob_, E_);
  if (!parallel()) {  // (expert parallelism has its own: ep_send_w_, ep_w_, ep_dot_)
    carver.request(&row_weight_, n);
    carver.request(&row_dot_, n);
  }
  if (on_device_) {
    host_logits_.resize(static_cast<size_t>(n * E_));
    host_probs_.resize(static_cast<size_t>(n * E_));
    host_top_weight_.resize(static_cast<size_t>(nk));
    host_top_expert_.resize(static_cast<size_t>(nk));
    host_token_.resize(static_cast<size_t>(nk));
    host_slot_.resize(static_cast<size_t>(nk));
  }
  if (lora_) lora_->carve(carver, n);
  if (parallel()) ep_carve(carver, n);
}

MoeExperts::LayerRouting& MoeExperts::layer(int l) {
  const int s = sparse_index_.at(static_cast<size_t>(l));
  SHARDLM_CHECK(s >= 0, "model: layer {} is not a mixture-of-experts layer", l);
  return layers_[static_cast<size_t>(s)];
}

std::pair<int64_t, int64_t> MoeExperts::assignments(const LayerRouting& r, int e) const {
  const int32_t* begin = meta_ ? meta_begin_.data()
                         : on_device_ ? r.host_begin.data()
                                      : r.routing.expert_begin;
  return {begin[e], begin[e + 1]};
}

void MoeExperts::route(int l, int64_t n, Backend& be) {
  if (l == first_sparse_) stats_.reset(E_);
  n_ = n;
  LayerRouting& r = layer(l);
  if (meta_) {
    meta_begin_.assign(static_cast<size_t>(E_) + 1, 0);
    for (int e = 0; e < E_; ++e)
      meta_begin_[static_cast<size_t>(e) + 1] =
          static_cast<int32_t>(n * k_ * (e + 1) / E_);
    return;
  }
  if (on_device_) return route_on_host(r, be);
  route_tokens(logits_, shape(), r.routing);
  stats_.add(r.routing, shape());
}

void MoeExperts::route_on_host(LayerRouting& r, Backend& be) {
  const int64_t n = n_, nk = n_ * k_;
  be.copy_to_host(host_logits_.data(), logits_, sizeof(float) * static_cast<size_t>(n * E_));
  MoeRouting host{host_probs_.data(), host_top_expert_.data(), host_top_weight_.data(),
                  r.host_begin.data(), host_token_.data(), host_slot_.data()};
  route_tokens(host_logits_.data(), shape(), host);
  stats_.add(host, shape());
  const auto to_device = [&](auto* dst, const auto* src, int64_t count) {
    be.copy_from_host(dst, src, sizeof(*src) * static_cast<size_t>(count));
  };
  to_device(r.routing.probs, host.probs, n * E_);
  to_device(r.routing.top_expert, host.top_expert, nk);
  to_device(r.routing.top_weight, host.top_weight, nk);
  to_device(r.routing.expert_begin, host.expert_begin, E_ + 1);
  to_device(r.routing.token, host.token, nk);
  to_device(r.routing.slot, host.slot, nk);
}

void MoeExperts::sum_load_balance(Communicator& context_group) {
  std::vector<double> sums = stats_.sums();
  context_group.all_reduce_blocking(std::span<double>(sums), ReduceOp::sum, "moe load-balancing sums");
  stats_.set_sums(sums);
}

void MoeExperts::keep_h2(int l, Backend& be, ConstTypedPtr h2) {
  be.convert_rows(layer(l).kept_h2, C_, h2, C_, n_, C_);
}

void MoeExperts::expert_activations(LayerRouting& r, int64_t begin, int64_t rows, Backend& be,
                                    bool row_by_row, ConstTypedPtr h2, const ExpertWeights& w) {
  gather_h2(h2, r.routing.token + begin, rows, be);
  const int m = static_cast<int>(rows), c = static_cast<int>(C_), i1 = static_cast<int>(I_);
  const int64_t at = activation_row(begin);
  const TypedPtr gate_up = (recompute_ ? shared_gate_up_ : r.gate_up).at(at * 2 * I_);
  const TypedPtr act = (recompute_ ? shared_act_ : r.act).at(at * I_);
  float* gu_f = compute_ == DType::fp32 ? gate_up.f32() : gu_f_;
  forward_gemm(be, row_by_row, true, m, 2 * i1, c, 1.0f, xe_, c, w.gate_up, c, 0.0f, gu_f, 2 * i1);
  if (w.lora.gate_up.targeted())
    lora_->forward(be, row_by_row, w.lora.gate_up, m, c, 2 * i1, xe_, gu_f, 2 * i1);
  be.swiglu_forward(act, gate_up, gu_f, rows, i1);
}

void MoeExperts::gather_h2(ConstTypedPtr h2, const int32_t* tokens, int64_t rows, Backend& be) {
  be.gather_rows(xe_, h2, tokens, rows, C_);
}

void MoeExperts::expert_forward(int l, int e, Backend& be, bool row_by_row, ConstTypedPtr h2,
                                const ExpertWeights& w, float* out) {
  LayerRouting& r = layer(l);
  if (parallel()) return ep_expert_forward(r, e, be, row_by_row, w, out);
  const auto [begin, end] = assignments(r, e);
  const int64_t rows = end - begin;
  if (rows == 0) return;
  const int32_t* tokens = r.routing.token + begin;
  const int m = static_cast<int>(rows), c = static_cast<int>(C_), i1 = static_cast<int>(I_);
  expert_activations(r, begin, rows, be, row_by_row, h2, w);
  const TypedPtr act = (recompute_ ? shared_act_ : r.act).at(activation_row(begin) * I_);
  forward_gemm(be, row_by_row, true, m, c, i1, 1.0f, act, i1, w.down, i1, 0.0f, out_, c);
  if (w.lora.down.targeted()) lora_->forward(be, row_by_row, w.lora.down, m, i1, c, act, out_, c);
  be.moe_assignment_weights(row_weight_, r.routing.top_weight, tokens, r.routing.slot + begin, k_,
                            rows);
  be.scatter_add_rows(out, out_, tokens, row_weight_, rows, C_);
}

void MoeExperts::expert_backward(int l, int e, Backend& be, const ParamRounding& rounding,
                                 ConstTypedPtr h2, const ExpertWeights& w, const float* dy,
                                 float* grad_gate_up, float* grad_down) {
  LayerRouting& r = layer(l);
  if (parallel()) return ep_expert_backward(r, e, be, rounding, h2, w, dy, grad_gate_up, grad_down);
  if (e == E_ - 1) {  // the first expert of the layer's backward
    be.fill_zero(dh2_, sizeof(float) * static_cast<size_t>(n_ * C_));
    be.fill_zero(dtop_, sizeof(float) * static_cast<size_t>(n_ * k_));
  }
  const auto [begin, end] = assignments(r, e);
  const int64_t rows = end - begin;
  if (rows == 0) return;
  const int32_t* tokens = r.routing.token + begin;
  const int32_t* slots = r.routing.slot + begin;
  const int m = static_cast<int>(rows), c = static_cast<int>(C_), i1 = static_cast<int>(I_);
  if (recompute_) expert_activations(r, begin, rows, be, /*row_by_row=*/false, h2, w);
  const int64_t at = activation_row(begin);
  const TypedPtr gate_up = (recompute_ ? shared_gate_up_ : r.gate_up).at(at * 2 * I_);
  const TypedPtr act = (recompute_ ? shared_act_ : r.act).at(at * I_);
  be.moe_assignment_weights(row_weight_, r.routing.top_weight, tokens, slots, k_, rows);
  // g = dy_e Wdown (unweighted): the weight's gradient is <g, silu(gate) * up> and
  // the activation's is weight * g.
  be.gather_rows(TypedPtr(out_), ConstTypedPtr(dy), tokens, rows, C_);
  ConstTypedPtr dy_e = rounding.for_gemm(out_, out_c_, rows * C_);
  be.gemm(false, false, m, i1, c, 1.0f, dy_e, c, w.down, i1, 0.0f, g_, i1);
  if (w.lora.down.targeted()) lora_->input_gradient(be, w.lora.down, m, i1, c, dy_e, g_);
  float* act_f = dgu_;  // act as fp32, before dgu_ is written
  be.convert_rows(act_f, I_, act, I_, rows, I_);
  be.moe_weight_backward(row_dot_, g_, act_f, I_, out_, C_, row_weight_, rows);
  be.moe_scatter_weight_grads(dtop_, row_dot_, tokens, slots, k_, rows);
  if (grad_down != nullptr || w.lora.down.targeted()) {
    const ConstTypedPtr dyw = rounding.for_gemm(out_, out_c_, rows * C_);
    if (grad_down != nullptr) be.gemm(true, false, c, i1, m, 1.0f, dyw, c, act, i1, 1.0f, grad_down, i1);
    if (w.lora.down.targeted()) lora_->weight_gradients(be, w.lora.down, m, i1, c, act, dyw);
  }
  be.swiglu_backward(dgu_, g_, gate_up, rows, i1);
  const ConstTypedPtr dgu = rounding.for_gemm(dgu_, dgu_c_, rows * 2 * I_);
  if (grad_gate_up != nullptr || w.lora.gate_up.targeted()) gather_h2(h2, tokens, rows, be);
  if (grad_gate_up != nullptr)
    be.gemm(true, false, 2 * i1, c, m, 1.0f, dgu, 2 * i1, xe_, c, 1.0f, grad_gate_up, c);
  be.gemm(false, false, m, c, 2 * i1, 1.0f, dgu, 2 * i1, w.gate_up, c, 0.0f, dx_, c);
  if (w.lora.gate_up.targeted()) {
    lora_->weight_gradients(be, w.lora.gate_up, m, c, 2 * i1, xe_, dgu);
    lora_->input_gradient(be, w.lora.gate_up, m, c, 2 * i1, dgu, dx_);
  }
  be.scatter_add_rows(dh2_, dx_, tokens, nullptr, rows, C_);
}

ConstTypedPtr MoeExperts::router_backward(int l, Backend& be, double aux_weight,
                                          const ParamRounding& rounding) {
  LayerRouting& r = layer(l);
  if (aux_weight != 0) {
    const std::vector<float> aux = stats_.prob_gradient(aux_weight);
    be.copy_from_host(aux_dprob_, aux.data(), sizeof(float) * aux.size());
  }
  be.moe_router_backward(dlogits_, r.routing.probs, r.routing.top_expert, dtop_,
                         aux_weight != 0 ? aux_dprob_ : nullptr, n_, E_, k_, norm_topk_);
  return rounding.for_gemm(dlogits_, dlogits_c_, n_ * E_);
}

}  // namespace shardlm
