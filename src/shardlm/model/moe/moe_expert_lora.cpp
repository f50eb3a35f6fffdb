#include "shardlm/model/moe/moe_expert_lora.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/model/llama/llama_family.hpp"
#include "shardlm/model/llama/llama_lora.hpp"
#include "shardlm/model/moe/moe_names.hpp"

namespace shardlm {

void ExpertLora::carve(ArenaCarver& carver, int64_t n) {
  carver.request(&u_, n * r_);
  if (compute_ != DType::fp32) carver.request(&u_c_, compute_, n * r_);
}

ConstTypedPtr ExpertLora::rounded(Backend& be, float* u, TypedPtr c, int m) const {
  if (compute_ == DType::fp32) return u;
  be.convert(c, u, static_cast<int64_t>(m) * r_);
  return c;
}

void ExpertLora::forward(Backend& be, bool row_by_row, const ExpertLoraFactor& f, int m, int in,
                         int out, ConstTypedPtr x, float* y, int ldy) {
  forward_gemm(be, row_by_row, true, m, r_, in, 1.0f, x, in, f.a, in, 0.0f, u_, r_);  // x A^T
  const ConstTypedPtr u = rounded(be, u_, u_c_, m);
  forward_gemm(be, row_by_row, true, m, out, r_, s_, u, r_, f.b, r_, 1.0f, y, ldy);
}

void ExpertLora::input_gradient(Backend& be, const ExpertLoraFactor& f, int m, int in, int out,
                                ConstTypedPtr dy, float* dx) {
  be.gemm(false, false, m, r_, out, s_, dy, out, f.b, r_, 0.0f, u_, r_);  // s dy B
  const ConstTypedPtr du = rounded(be, u_, u_c_, m);
  be.gemm(false, false, m, in, r_, 1.0f, du, r_, f.a, in, 1.0f, dx, in);
}

void ExpertLora::weight_gradients(Backend& be, const ExpertLoraFactor& f, int m, int in, int out,
                                  ConstTypedPtr x, ConstTypedPtr dy) {
  if (f.grad_b != nullptr) {
    be.gemm(false, true, m, r_, in, 1.0f, x, in, f.a, in, 0.0f, u_, r_);  // x A^T
    const ConstTypedPtr u = rounded(be, u_, u_c_, m);
    be.gemm(true, false, out, r_, m, s_, dy, out, u, r_, 1.0f, f.grad_b, r_);
  }
  if (f.grad_a != nullptr) {
    be.gemm(false, false, m, r_, out, s_, dy, out, f.b, r_, 0.0f, u_, r_);  // s dy B
    const ConstTypedPtr du = rounded(be, u_, u_c_, m);
    be.gemm(true, false, r_, in, m, 1.0f, du, r_, x, in, 1.0f, f.grad_a, in);
  }
}

std::string expert_lora_name(int layer, int expert, const std::string& projection, char matrix) {
  return llama_param_name(layer, "mlp.experts." + std::to_string(expert) + "." + projection +
                                     ".lora_" + std::string(1, matrix) + ".weight");
}

std::vector<std::string> peft_target_parameters(const ModelConfig& c) {
  std::vector<std::string> out;
  if (!llama_expert_lora(c)) return out;
  for (const auto& m : moe_expert_lora_modules())
    if (c.lora.targets_module(m)) out.push_back("mlp." + m);
  return out;
}

std::vector<PeftExpertTensor> peft_expert_adapters(const ModelConfig& c) {
  std::vector<PeftExpertTensor> out;
  if (!llama_expert_lora(c)) return out;
  const bool gate_up = c.lora.targets_module("experts.gate_up_proj");
  const bool down = c.lora.targets_module("experts.down_proj");
  const int64_t E = c.moe.num_experts, r = c.lora.rank, C = c.n_embd;
  const int64_t I = c.moe.expert_intermediate_size;
  for (int l = 0; l < c.n_layer; ++l) {
    if (!c.moe.sparse_layer(l)) continue;
    const std::string prefix = "base_model.model." + llama_param_name(l, "mlp.experts.");
    auto add = [&](const std::string& projection, const std::string& wrapper, int64_t in,
                   int64_t out_rows) {
      PeftExpertTensor a{prefix + wrapper + "lora_A.weight", {E * r, in}, {}, false};
      PeftExpertTensor b{prefix + wrapper + "lora_B.weight", {out_rows, r * E}, {}, true};
      for (int e = 0; e < E; ++e) {
        a.sources.push_back(expert_lora_name(l, e, projection, 'A'));
        b.sources.push_back(expert_lora_name(l, e, projection, 'B'));
      }
      out.push_back(std::move(a));
      out.push_back(std::move(b));
    };
    if (gate_up) add("gate_up_proj", down ? "base_layer." : "", C, 2 * I);
    if (down) add("down_proj", "", I, C);
  }
  return out;
}

std::vector<ExpertLoraMerge> expert_lora_merges(const ModelConfig& c) {
  std::vector<ExpertLoraMerge> out;
  if (!llama_expert_lora(c)) return out;
  const bool gate_up = c.lora.targets_module("experts.gate_up_proj");
  const bool down = c.lora.targets_module("experts.down_proj");
  const int64_t I = c.moe.expert_intermediate_size;
  const MoeNames& names = moe_names(c);
  for (int l = 0; l < c.n_layer; ++l) {
    if (!c.moe.sparse_layer(l)) continue;
    for (int e = 0; e < c.moe.num_experts; ++e) {
      const MoeNames::Expert w = names.expert(l, e);
      if (gate_up) {
        const std::string a = expert_lora_name(l, e, "gate_up_proj", 'A');
        const std::string b = expert_lora_name(l, e, "gate_up_proj", 'B');
        out.push_back({w.gate, a, b, 0});
        out.push_back({w.up, a, b, I});
      }
      if (down)
        out.push_back({w.down, expert_lora_name(l, e, "down_proj", 'A'),
                       expert_lora_name(l, e, "down_proj", 'B'), 0});
    }
  }
  return out;
}

void fuse_expert_adapter(const PeftExpertTensor& t, const std::vector<std::vector<float>>& experts,
                         std::vector<float>& fused) {
  const int64_t E = static_cast<int64_t>(t.sources.size());
  SHARDLM_CHECK(static_cast<int64_t>(experts.size()) == E, "export: {} has {} experts, got {}",
                t.name, E, experts.size());
  const int64_t rows = t.shape[0], cols = t.shape[1];
  fused.assign(static_cast<size_t>(rows * cols), 0.0f);
  if (!t.interleaved) {  // A: [E r, in], expert e's [r, in] block at rows e r
    const int64_t per = rows * cols / E;
    for (int64_t e = 0; e < E; ++e) {
      SHARDLM_CHECK(static_cast<int64_t>(experts[static_cast<size_t>(e)].size()) == per,
                    "export: {}: expert {} has {} elements, expected {}", t.name, e,
                    experts[static_cast<size_t>(e)].size(), per);
      std::copy(experts[static_cast<size_t>(e)].begin(), experts[static_cast<size_t>(e)].end(),
                fused.begin() + e * per);
    }
    return;
  }
  const int64_t r = cols / E;  // B: [out, r E], column j E + e = B_e's column j
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<float>& b = experts[static_cast<size_t>(e)];
    SHARDLM_CHECK(static_cast<int64_t>(b.size()) == rows * r, "export: {}: expert {} has {} "
                  "elements, expected {}", t.name, e, b.size(), rows * r);
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t j = 0; j < r; ++j) fused[static_cast<size_t>(o * cols + j * E + e)] = b[static_cast<size_t>(o * r + j)];
  }
}

}  // namespace shardlm
