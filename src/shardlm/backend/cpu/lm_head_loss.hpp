// Fused LM head + cross-entropy, chunked over token rows, so the [N, V] logits
// tensor never exists: for each chunk of rows it computes the chunk's logits, the
// loss, and (when asked) turns the logits in place into dlogits and runs the two
// backward GEMMs right away. No extra vocabulary-sized GEMM is needed.
//
// Only the first V (real vocabulary) rows of the weight take part: padded rows are
// never read or written, so padded logits cannot affect the loss or a gradient.
//
// Mixed precision: x and weight may be in a compute type (bf16, fp16). The logits
// are the GEMM's fp32 output and the softmax, loss and dlogits are fp32; dlogits are
// rounded into dlogits_scratch (same type as x) for the two backward GEMMs, whose
// results (dx, dweight) are fp32.
#pragma once

#include "shardlm/backend/kernel_args.hpp"

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

using ::shardlm::LmHeadLossArgs;

// losses[n] = cross-entropy of row n (0 for ignored rows). If dx != nullptr:
// dx [N, C] is OVERWRITTEN with grad_scale * dloss/dx and dweight [V, C] ACCUMULATES
// grad_scale * dloss/dweight (dweight null: a frozen head, no weight gradient).
void lm_head_cross_entropy(const LmHeadLossArgs& args, float* losses, float* dx, float* dweight);

}  // namespace shardlm::cpu
