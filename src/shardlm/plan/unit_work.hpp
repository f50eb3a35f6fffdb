// What one training micro-batch costs each model unit, in FLOPs and bytes: the
// compute half of the step-time model (plan/time_model.hpp), derived from the model's
// units and the family's FLOPs per token so any family plugs in.
//
// Conventions (the rates of a HardwareProfile are measured in the same ones, so
// constant factors cancel; `shardlm calibrate` measures them on the real kernels):
//  - A matrix is multiplied by the last model unit that reads it (unit_needs): its
//    own unit, the final unit for a tied embedding, the layer for LoRA's adapter
//    units (which compute nothing themselves); model unit 0 only looks embeddings up.
//    That unit also does the rest of the matrix's work (elementwise bytes below).
//  - A mixture-of-experts expert's matrices multiply top_k / num_experts of the tokens
//    on average (UnitLayout::token_fraction); every count below is scaled by it.
//  - gemm_flops: 2 x (matrix elements) per token forward; backward 2 more for the
//    input gradient (dX) and, only when the matrix trains, 2 more for its weight
//    gradient (dW). A frozen matrix (LoRA's base) costs 2 + 2, a trained one 2 + 4.
//  - attention_flops: the family's FLOPs per token minus the GEMM FLOPs above, which
//    leaves exactly causal attention's matmuls (the families count 6 per trained and
//    4 per frozen matrix element), spread evenly over the units that multiply
//    matrices between the first and the last (the blocks), a third forward and two
//    thirds backward.
//  - elementwise_bytes: a proxy for what norms, biases, activations, residuals and
//    embedding lookups stream: 8 bytes (read + write of an fp32 value) per token for
//    each 1-D parameter element and each (2-D weight elements / n_embd) of the unit
//    (the width of its layers); backward twice forward, except a frozen embedding
//    table, whose backward writes nothing. QLoRA adds the dequantization of each
//    layer's NF4 weights, once in forward and once in backward (one conversion
//    serves the recompute and the backward): the stored words read plus the values
//    written in the weight type (fp32, or bf16; fp16 runs dequantize to fp32 and round
//    in place, 8 bytes more per value).
//  - loss_bytes: 8 bytes per token and padded vocabulary entry (the softmax reads the
//    logits and writes their gradient), in the last unit's forward.
//  - state_bytes, optimizer_bytes (per step, outside the model units: what the meta
//    kernels of the strategy and the optimizer record in the traced step,
//    plan/traced_step.hpp): bytes of gradients and parameters zeroed, summed,
//    rounded and accumulated, and, apart, those AdamW reads and writes (the phase
//    profile's "optimizer"); both at the profile's state rate. Frozen units have none.
//  - Tensor parallelism (`tensor`: T ranks, this one's coordinate): the GEMMs and the
//    elementwise proxy count the rank's own pieces of the split matrices
//    (split_for_tensor_rank: 1/T of q/k/v/o/gate/up/down, a replicated key/value head
//    whole, 1/T of the vocabulary-parallel embedding and head) and every whole
//    parameter in full (norms); attention runs over H/T query heads and the loss's
//    softmax over padded vocabulary / T logits: 1/T of the unsplit rank's. With
//    sequence parallelism (options.sequence_parallel) the whole 1-D parameters' proxy
//    (the norms, o_proj's bias) runs over the rank's 1/T of the tokens.
// Activation checkpointing adds each block's forward GEMMs, attention and
// elementwise work to its backward (recomputation).
#pragma once

#include <vector>

#include "shardlm/backend/meta/compute_work.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/model/tensor_parallel/tensor_piece.hpp"

namespace shardlm {

struct UnitWork {
  ComputeWork forward, backward;  // one micro-batch
};

// model_units: the family's model units (ModelFamily::model_units), whose `trainable`
// says whether their matrices get weight gradients; unit_needs: per model unit, the
// model units it reads (a tied head reads unit 0, a LoRA layer its adapters);
// flops_per_token: the family's training FLOPs per token at seq_len.
std::vector<UnitWork> model_unit_work(const ModelConfig& config,
                                      const std::vector<UnitLayout>& model_units,
                                      const std::vector<std::vector<int>>& unit_needs,
                                      double flops_per_token, int micro_batch, int seq_len,
                                      const ModelOptions& options, TensorSplit tensor = {});

}  // namespace shardlm
