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

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

struct LmHeadLossArgs {
  ConstTypedPtr x;                   // [N, C] final hidden states (after ln_f)
  ConstTypedPtr weight;              // [>= V, C] head weight (GPT-2: tied wte)
  const int32_t* targets = nullptr;  // [N]; a negative target is ignored
  int64_t N = 0;
  int C = 0;
  int V = 0;                         // real vocabulary size
  float grad_scale = 1.0f;           // gradients are of grad_scale * sum(loss)
  float* logits_scratch = nullptr;   // [chunk_rows, logits_stride]
  TypedPtr dlogits_scratch;          // [chunk_rows, logits_stride] in x's type; only
                                     // when x is not fp32 and gradients are wanted
  int64_t logits_stride = 0;         // >= V (the padded vocabulary keeps rows aligned)
  int chunk_rows = 0;
};

// losses[n] = cross-entropy of row n (0 for ignored rows). If dx != nullptr:
// dx [N, C] is OVERWRITTEN with grad_scale * dloss/dx and dweight [V, C] ACCUMULATES
// grad_scale * dloss/dweight (dweight null: a frozen head, no weight gradient).
void lm_head_cross_entropy(const LmHeadLossArgs& args, float* losses, float* dx, float* dweight);

}  // namespace shardlm::cpu
