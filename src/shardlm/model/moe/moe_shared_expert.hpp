// MoeSharedExpert: Qwen2-MoE's shared expert of a sparse layer (Qwen2MoeSparseMoeBlock,
// transformers 5.24), computed in the layer's own model unit: it sees every token, so
// it is dense (replicated or sharded as the layer is), not one of the routed experts.
//   g|u = h2 Wgu^T; s = (silu(g) * u) Wdown^T   (a SwiGLU MLP of width Is)
//   z = h2 wg^T (shared_expert_gate, [1, C]);  y += sigmoid(z) s
// Backward from dy = dLoss/dy: ds = sigmoid(z) dy, dz = sigmoid(z) (1 - sigmoid(z)) <dy, s>;
// the MLP's backward from ds; dh2 += (its input gradient) + dz wg; dwg += dz^T h2.
//
// Precision as the dense MLP's: GEMM inputs (h2, g|u, silu(g) * u, ds, dz) in the compute
// type, outputs and gradients fp32. Activation checkpointing (recompute): one set of
// activations shared by the layers, refilled by forward(y = null) before each backward.
// Everything runs as backend kernels (the gate's sigmoid and its per-row products too:
// cpu/moe.hpp), so on a device and on the meta device (plan) alike.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/model_support.hpp"

namespace shardlm {

// LoRA on the shared expert's gate_proj|up_proj and down_proj (PEFT's nn.Linear modules
// mlp.shared_expert.*: the model's adapter GEMMs, model/llama/llama_lora.hpp); an empty
// function: that projection has no adapter.
struct SharedExpertLora {
  // y (the projection's fp32 output [n, out]) += s (x A^T) B^T.
  std::function<void(ConstTypedPtr x, float* y)> gate_up_forward, down_forward;
  // The adapters' gradients from dy (the projection's output gradient as its GEMMs read
  // it), and dx [n, in] += s (dy B) A.
  std::function<void(ConstTypedPtr x, ConstTypedPtr dy, float* dx)> gate_up_backward, down_backward;
};

struct SharedExpertWeights {
  ConstTypedPtr gate_up;  // [2 Is, C]: gate_proj rows, then up_proj rows
  ConstTypedPtr down;     // [C, Is]
  ConstTypedPtr gate;     // [1, C] shared_expert_gate
};

class MoeSharedExpert {
 public:
  MoeSharedExpert(const ModelConfig& config, DType compute, bool recompute);

  void carve(ArenaCarver& carver, int64_t n);
  // Elements of the layer's weights it reads (gate|up, down, gate).
  int64_t weight_elements() const { return 3 * Is_ * C_ + C_; }

  // Layer l's activations from h2 [n, C]; y [n, C] += sigmoid(z) s (null: keep them only).
  void forward(int layer, Backend& be, bool row_by_row, ConstTypedPtr h2,
               const SharedExpertWeights& w, int64_t n, float* y, const SharedExpertLora& lora = {});
  // From dy [n, C]: weight gradients (+=, null: frozen) and dh2 [n, C] += its share.
  void backward(int layer, Backend& be, const ParamRounding& rounding, ConstTypedPtr h2,
                const SharedExpertWeights& w, const float* dy, float* grad_gate_up,
                float* grad_down, float* grad_gate, float* dh2, const SharedExpertLora& lora = {});

 private:
  struct Activations {
    TypedPtr gate_up;      // [n, 2 Is]
    TypedPtr act;          // [n, Is]
    float* out = nullptr;  // [n, C] s
    float* sig = nullptr;  // [n] sigmoid(z)
  };
  Activations& acts(int layer);

  int64_t C_ = 0, Is_ = 0;
  DType compute_ = DType::fp32;
  bool recompute_ = false;
  std::vector<int> sparse_index_;  // per layer: index into acts_, or -1
  std::vector<Activations> acts_;
  int64_t n_ = 0;
  // Scratch (one layer at a time).
  float* gu_f_ = nullptr;   // [n, 2 Is] fp32 GEMM output (compute != fp32)
  float* dz_ = nullptr;     // [n]
  TypedPtr dz_c_;           // [n]
  float* ds_ = nullptr;     // [n, C]
  TypedPtr ds_c_;           // [n, C]
  float* dact_ = nullptr;   // [n, Is]
  float* dgu_ = nullptr;    // [n, 2 Is]
  TypedPtr dgu_c_;          // [n, 2 Is]
};

}  // namespace shardlm
