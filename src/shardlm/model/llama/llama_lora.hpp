// LoRA on the Llama families' linear layers: which modules exist, how they group into
// the model's fused GEMMs, and the model units a LoRA run has.
//
// Model units with adapters: 0 embeddings (frozen), then per layer l its adapter unit
// (trainable) followed by the layer (frozen), last the final norm and head (frozen):
//   [embed, adapters 0, layer 0, adapters 1, layer 1, ..., final]
// The adapters come first so that, in backward order, layer l's backward (which writes
// the adapters' gradients) runs before the adapter unit's after_backward hook, where a
// strategy reduces a unit's gradient. Layer l's forward and backward read both units.
//
// A layer's four GEMM groups and their modules (PEFT's target_modules names):
//   qkv      q_proj, k_proj, v_proj   input ln1 [N, C]      output q|k|v [N, Q + 2 KV]
//   o        o_proj                   input attention [N, Q] output [N, C]
//   gate_up  gate_proj, up_proj       input ln2 [N, C]      output g|u [N, 2 I]
//   down     down_proj                input silu(g)u [N, I] output [N, C]
// The targeted modules' A matrices of a group are packed back to back ([n r, in], one
// GEMM gives every target's x A^T); each B [out, r] adds into its columns of the output.
// In a qwen2_moe sparse layer gate_up and down are its shared expert's (I its width,
// mlp.shared_expert.*_proj, PEFT's nn.Linear modules of those names); a qwen3_moe or
// mixtral sparse layer has no MLP group.
//
// Mixture-of-experts models: LoRA on the routed experts as PEFT 0.21 adapts transformers
// 5's fused expert parameters (`target_parameters`, lora.ParamWrapper): targets
// `experts.gate_up_proj` and `experts.down_proj`. Each expert e gets its own pair
//   gate_up_proj  A_e [r, C] (one A for gate and up), B_e [2 I, r]: g|u += s (x A_e^T) B_e^T
//   down_proj     A_e [r, I],                          B_e [C, r]: y   += s (a A_e^T) B_e^T
// with s = alpha / r, in an adapter unit of its own (model/moe/moe_expert_lora.hpp),
// placed and partitioned with its expert; a layer's expert adapter units come before
// its experts, so that every expert's backward (which writes its adapters' gradients)
// runs before the adapter units' after_backward hooks, and so that under expert
// parallelism every rank prefetches the layer's unit after the layer's last expert
// exchange (a rank skips the units held elsewhere):
//   [..., layer l, expert adapters l.0 .. l.E-1, expert l.0 .. l.E-1, ...]
// Export fuses them into PEFT's tensors (moe_expert_lora.hpp: peft_expert_adapters).
#pragma once

#include <string>
#include <vector>

#include "shardlm/model/config.hpp"

namespace shardlm {

struct LoraTarget {
  std::string module;    // "q_proj"
  std::string parent;    // "self_attn" or "mlp"
  int64_t out = 0;       // rows of the module's weight
  int64_t out_offset = 0;  // its columns in the group's output
};

struct LoraGroup {
  enum class Input { ln1, attention, ln2, act } input;
  int64_t in = 0;         // columns of the group's weights
  int64_t out_width = 0;  // width of the group's output (all modules, targeted or not)
  std::vector<LoraTarget> targets;  // the targeted modules only
};

// Every module name LoRA can target in these families, in layer order.
const std::vector<std::string>& llama_lora_modules();
// The mixture-of-experts families' expert targets: experts.gate_up_proj, experts.down_proj.
const std::vector<std::string>& moe_expert_lora_modules();
// Whether the run adapts the routed experts (and so has expert adapter units).
bool llama_expert_lora(const ModelConfig& config);
// Whether every layer has an adapter unit: LoRA on attention or MLP modules (a run
// that adapts only the experts has none).
bool llama_layer_adapters(const ModelConfig& config);

// Layer l's groups with their targeted modules (groups without a target omitted), as
// one of `tensor_size` tensor ranks computes them (model/tensor_parallel/tensor_layout.hpp):
// q|k|v and gate|up narrowed to the rank's output columns, o's and down's input to its
// input columns. The MLP modules gate_proj/up_proj/down_proj are PEFT's nn.Linear
// modules of those names: a dense layer's MLP (parent "mlp"; every layer of a dense
// model, and a mixture of experts' mlp_only_layers and the layers decoder_sparse_step
// skips), a sparse layer's shared expert (qwen2_moe: parent "mlp.shared_expert", width
// shared_expert_intermediate_size); a sparse layer without one has no MLP group.
std::vector<LoraGroup> llama_lora_groups(const ModelConfig& config, int tensor_size, int layer);

// Names of a target's matrices in layer l ("model.layers.3.self_attn.q_proj.lora_A.weight").
std::string lora_a_name(int layer, const LoraTarget& t);
std::string lora_b_name(int layer, const LoraTarget& t);

// What model unit u is in a run with or without adapters. A mixture-of-experts layer
// (model/moe/moe_experts.hpp) is followed by one unit per expert, so that each expert
// is gathered, reduced and (later) placed on an expert-parallel rank on its own:
//   [embed, (adapters 0), layer 0, (expert adapters 0.*), (expert 0.0, ..., expert 0.E-1), ..., final]
struct LlamaUnitRole {
  enum class Kind { embeddings, adapters, layer, expert_adapters, expert, final } kind;
  int layer = -1;
  int expert = -1;  // Kind::expert and Kind::expert_adapters only
};
LlamaUnitRole llama_unit_role(const ModelConfig& config, int unit);
// Every model unit's role, in step order.
std::vector<LlamaUnitRole> llama_unit_roles(const ModelConfig& config);
int llama_num_units(const ModelConfig& config);
// The model unit of layer l's adapters (-1 without LoRA), of layer l itself and of
// expert e of sparse layer l.
int llama_adapter_unit(const ModelConfig& config, int layer);
int llama_layer_unit(const ModelConfig& config, int layer);
int llama_expert_unit(const ModelConfig& config, int layer, int expert);
// The model unit of expert e's adapters (llama_expert_lora only).
int llama_expert_adapter_unit(const ModelConfig& config, int layer, int expert);

}  // namespace shardlm
