// Argument checks every backend applies before a kernel runs (one-line Errors naming the
// kernel and what was expected), so the CPU and CUDA backends refuse the same input.
#pragma once

#include <cstdint>

#include "shardlm/backend/kernel_args.hpp"

namespace shardlm {

// RMSNorm: heads, dim > 0; both row strides hold heads * dim values; eps >= 0.
void check_rmsnorm_shape(const RmsNormShape& s, int64_t ld_a, int64_t ld_b, float eps);
// RoPE: head_dim is the table's; heads > 0; both row strides hold heads * head_dim values.
// (Positions are checked where they are host memory: cpu/rope.cpp, and the models.)
void check_rope_shape(int64_t ld_out, int64_t ld_in, int64_t rows, int heads, int head_dim,
                      const RopeTableView& table);
// The fused LM head: chunk_rows > 0, V > 0, logits_stride >= V; a compute-type x with
// gradients wanted needs a dlogits scratch of x's type.
void check_lm_head_args(const LmHeadLossArgs& a, bool want_grad);

}  // namespace shardlm
