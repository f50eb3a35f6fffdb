// What one training micro-batch costs each model unit, in FLOPs and bytes: the
// compute half of the step-time model (plan/time_model.hpp), derived from the model's
// units and the family's FLOPs per token so any family plugs in.
//
// Conventions (the rates of a HardwareProfile are measured in the same ones, so
// constant factors cancel; `shardlm calibrate` measures them on the real kernels):
//  - gemm_flops: 2 x (weight elements) per token forward, 4 x backward, for every
//    matrix a unit multiplies by (a block's 2-D weights; the LM head, including a
//    tied embedding read by the last unit: the matrices with vocabulary rows). Model
//    unit 0 only looks embeddings up.
//  - attention_flops: the family's FLOPs per token minus the GEMM FLOPs above (what
//    is left is causal attention's matmuls), spread evenly over the blocks, a third
//    forward and two thirds backward.
//  - elementwise_bytes: a proxy for what norms, biases, activations, residuals and
//    embedding lookups stream: 8 bytes (read + write of an fp32 value) per token for
//    each 1-D parameter element and each (2-D weight elements / n_embd) of the unit
//    (the width of its layers); backward twice forward.
//  - loss_bytes: 8 bytes per token and padded vocabulary entry (the softmax reads the
//    logits and writes their gradient), in the last unit's forward.
//  - state_bytes (per step, from the strategy's schedule, plan/step_program.hpp):
//    bytes of parameters, gradients and optimizer state read plus written.
// Activation checkpointing adds each block's forward to its backward (recomputation).
#pragma once

#include <vector>

#include "shardlm/model/config.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

struct ComputeWork {
  double gemm_flops = 0;
  double attention_flops = 0;
  double elementwise_bytes = 0;
  double loss_bytes = 0;
  double state_bytes = 0;

  ComputeWork& operator+=(const ComputeWork& o);
  ComputeWork operator*(double factor) const;
  bool empty() const;
};

struct UnitWork {
  ComputeWork forward, backward;  // one micro-batch
};

// model_units: the family's model units (ModelFamily::model_units);
// unit_needs: per model unit, the model units it reads (a tied head reads unit 0);
// flops_per_token: the family's training FLOPs per token at seq_len.
std::vector<UnitWork> model_unit_work(const ModelConfig& config,
                                      const std::vector<UnitLayout>& model_units,
                                      const std::vector<std::vector<int>>& unit_needs,
                                      double flops_per_token, int micro_batch, int seq_len,
                                      bool activation_checkpointing);

}  // namespace shardlm
