// LoRA on one routed expert's projections (model/llama/llama_lora.hpp: PEFT 0.21's
// target_parameters on transformers 5's fused experts): the GEMMs MoeExperts adds
// around an expert's own, and the names PEFT gives the fused adapter tensors.
//
// For a projection y = x W^T (x [m, in], y [m, out]) with adapter A [r, in], B [out, r]
// and scale s: forward y += s (x A^T) B^T; backward dx += s (dy B) A,
// dB += s dy^T (x A^T), dA += s (dy B)^T x. The products x A^T and dy B ([m, r]) are
// fp32 GEMM outputs, rounded to the compute type before the next GEMM reads them (as
// the attention's LoRA does).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/model_support.hpp"

namespace shardlm {

// One projection's adapter as the GEMMs read it (a null when not targeted) and where
// its gradients go (null: not computed).
struct ExpertLoraFactor {
  ConstTypedPtr a, b;
  float* grad_a = nullptr;
  float* grad_b = nullptr;
  bool targeted() const { return a.data != nullptr; }
};

struct ExpertAdapters {
  ExpertLoraFactor gate_up, down;
  bool any() const { return gate_up.targeted() || down.targeted(); }
};

class ExpertLora {
 public:
  ExpertLora(int rank, float scale, DType compute) : r_(rank), s_(scale), compute_(compute) {}
  // Scratch for m <= n rows.
  void carve(ArenaCarver& carver, int64_t n);
  // y [m, out] (row stride ldy) += s (x A^T) B^T.
  void forward(Backend& be, bool row_by_row, const ExpertLoraFactor& f, int m, int in, int out,
               ConstTypedPtr x, float* y, int ldy);
  // dx [m, in] += s (dy B) A, dy [m, out] a GEMM input.
  void input_gradient(Backend& be, const ExpertLoraFactor& f, int m, int in, int out,
                      ConstTypedPtr dy, float* dx);
  // grad_b += s dy^T (x A^T), grad_a += s (dy B)^T x.
  void weight_gradients(Backend& be, const ExpertLoraFactor& f, int m, int in, int out,
                        ConstTypedPtr x, ConstTypedPtr dy);

 private:
  // u [m, r] fp32 as a GEMM input (rounded into `c` below fp32).
  ConstTypedPtr rounded(Backend& be, float* u, TypedPtr c, int m) const;

  int r_ = 0;
  float s_ = 0.0f;
  DType compute_ = DType::fp32;
  float* u_ = nullptr;  // [n, r]
  TypedPtr u_c_;
};

// Names of expert e's adapters of sparse layer l in shardlm's checkpoints:
// model.layers.L.mlp.experts.E.{gate_up_proj,down_proj}.lora_{A,B}.weight.
// projection: "gate_up_proj" or "down_proj"; matrix: 'A' or 'B'.
std::string expert_lora_name(int layer, int expert, const std::string& projection, char matrix);

// PEFT's fused tensor of one projection of one sparse layer: PEFT's name, its shape, and
// where each element comes from. A: the experts' A_e stacked ([E r, in], expert-major);
// B: [out, r E] with B[o, j E + e] = B_e[o, j] (PEFT's lora_B.weight.reshape(out, r, E)).
// The gate_up_proj wrapper is the inner one when both are targeted (PEFT wraps the
// parameters in their module's order), which puts ".base_layer" in its names.
struct PeftExpertTensor {
  std::string name;  // "base_model.model.model.layers.L.mlp.experts.base_layer.lora_A.weight"
  std::vector<int64_t> shape;
  std::vector<std::string> sources;  // per expert, shardlm's name
  bool interleaved = false;          // B's rank-major columns
};
std::vector<PeftExpertTensor> peft_expert_adapters(const ModelConfig& config);
// PEFT's target_parameters of the run ("mlp.experts.gate_up_proj", ...); empty without.
std::vector<std::string> peft_target_parameters(const ModelConfig& config);
// Where an expert adapter's delta s B_e A_e lands in the expert's own weights (export
// --merge-lora; PEFT's ParamWrapper.merge adds the same delta into transformers' fused
// gate_up_proj [E, 2I, C] and down_proj [E, C, I], which save_pretrained splits per
// expert): gate_up_proj's B_e rows [0, I) into the gate weight (mixtral's w1), rows
// [I, 2I) into the up weight (w3); down_proj's B_e whole into the down weight (w2).
struct ExpertLoraMerge {
  std::string weight, a, b;  // the expert's base weight [rows, in], A_e [r, in], B_e
  int64_t b_row_offset = 0;  // B_e's row that lands in the weight's row 0
};
std::vector<ExpertLoraMerge> expert_lora_merges(const ModelConfig& config);
// Element i of PEFT tensor t from the experts' tensors (each [rows, cols] of one expert).
void fuse_expert_adapter(const PeftExpertTensor& t, const std::vector<std::vector<float>>& experts,
                         std::vector<float>& fused);

}  // namespace shardlm
