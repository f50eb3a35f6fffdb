#include "shardlm/model/moe/moe_shared_expert.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

MoeSharedExpert::MoeSharedExpert(const ModelConfig& c, DType compute, bool recompute)
    : C_(c.n_embd),
      Is_(c.moe.shared_expert_intermediate_size),
      compute_(compute),
      recompute_(recompute) {
  int sparse = 0;
  for (int l = 0; l < c.n_layer; ++l) sparse_index_.push_back(c.moe.sparse_layer(l) ? sparse++ : -1);
  acts_.resize(recompute ? 1 : static_cast<size_t>(sparse));
}

void MoeSharedExpert::carve(ArenaCarver& carver, int64_t n) {
  const DType ct = compute_;
  for (Activations& a : acts_) {
    carver.request(&a.gate_up, ct, n * 2 * Is_);
    carver.request(&a.act, ct, n * Is_);
    carver.request(&a.out, n * C_);
    carver.request(&a.sig, n);
  }
  if (ct != DType::fp32) {
    carver.request(&gu_f_, n * 2 * Is_);
    carver.request(&dz_c_, ct, n);
    carver.request(&ds_c_, ct, n * C_);
    carver.request(&dgu_c_, ct, n * 2 * Is_);
  }
  carver.request(&dz_, n);
  carver.request(&ds_, n * C_);
  carver.request(&dact_, n * Is_);
  carver.request(&dgu_, n * 2 * Is_);
}

MoeSharedExpert::Activations& MoeSharedExpert::acts(int l) {
  const int s = sparse_index_.at(static_cast<size_t>(l));
  SHARDLM_CHECK(s >= 0, "model: layer {} has no shared expert", l);
  return acts_[recompute_ ? 0 : static_cast<size_t>(s)];
}

void MoeSharedExpert::forward(int l, Backend& be, bool row_by_row, ConstTypedPtr h2,
                              const SharedExpertWeights& w, int64_t n, float* y,
                              const SharedExpertLora& lora) {
  Activations& a = acts(l);
  n_ = n;
  const int rows = static_cast<int>(n), c = static_cast<int>(C_), is = static_cast<int>(Is_);
  float* gu_f = compute_ == DType::fp32 ? a.gate_up.f32() : gu_f_;
  forward_gemm(be, row_by_row, true, rows, 2 * is, c, 1.0f, h2, c, w.gate_up, c, 0.0f, gu_f, 2 * is);
  if (lora.gate_up_forward) lora.gate_up_forward(h2, gu_f);
  be.swiglu_forward(a.act, a.gate_up, gu_f, n, is);
  forward_gemm(be, row_by_row, true, rows, c, is, 1.0f, a.act, is, w.down, is, 0.0f, a.out, c);
  if (lora.down_forward) lora.down_forward(a.act, a.out);
  forward_gemm(be, row_by_row, true, rows, 1, c, 1.0f, h2, c, w.gate, c, 0.0f, a.sig, 1);
  be.shared_expert_gate_forward(a.sig, y, a.out, n, C_);
}

void MoeSharedExpert::backward(int l, Backend& be, const ParamRounding& rounding, ConstTypedPtr h2,
                               const SharedExpertWeights& w, const float* dy, float* grad_gate_up,
                               float* grad_down, float* grad_gate, float* dh2,
                               const SharedExpertLora& lora) {
  const Activations& a = acts(l);
  const int64_t n = n_;
  const int rows = static_cast<int>(n), c = static_cast<int>(C_), is = static_cast<int>(Is_);
  be.shared_expert_gate_backward(dz_, ds_, dy, a.sig, a.out, n, C_);
  // The gate: z = h2 wg^T.
  const ConstTypedPtr dz = rounding.for_gemm(dz_, dz_c_, n);
  if (grad_gate != nullptr) be.gemm(true, false, 1, c, rows, 1.0f, dz, 1, h2, c, 1.0f, grad_gate, c);
  be.gemm(false, false, rows, c, 1, 1.0f, dz, 1, w.gate, c, 1.0f, dh2, c);
  // The MLP from ds.
  const ConstTypedPtr ds = rounding.for_gemm(ds_, ds_c_, n * C_);
  if (grad_down != nullptr) be.gemm(true, false, c, is, rows, 1.0f, ds, c, a.act, is, 1.0f, grad_down, is);
  be.gemm(false, false, rows, is, c, 1.0f, ds, c, w.down, is, 0.0f, dact_, is);
  if (lora.down_backward) lora.down_backward(a.act, ds, dact_);
  be.swiglu_backward(dgu_, dact_, a.gate_up, n, is);
  const ConstTypedPtr dgu = rounding.for_gemm(dgu_, dgu_c_, n * 2 * Is_);
  if (grad_gate_up != nullptr)
    be.gemm(true, false, 2 * is, c, rows, 1.0f, dgu, 2 * is, h2, c, 1.0f, grad_gate_up, c);
  be.gemm(false, false, rows, c, 2 * is, 1.0f, dgu, 2 * is, w.gate_up, c, 1.0f, dh2, c);
  if (lora.gate_up_backward) lora.gate_up_backward(h2, dgu, dh2);
}

}  // namespace shardlm
