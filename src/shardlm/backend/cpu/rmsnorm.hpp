// RMSNorm (Llama, Qwen2, Qwen3): y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps)
// over each vector of `dim` values; plain, fused with the residual add that precedes
// it, and per head inside a fused qkv row (Qwen3's q_norm / k_norm).
#pragma once

#include "shardlm/backend/kernel_args.hpp"

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// The vectors an RMSNorm normalizes: `rows` rows, each holding `heads` vectors of `dim`
// contiguous values one after another, rows `ld` elements apart in x, y and their
// gradients (each tensor has its own ld). heads = 1, ld = dim: a plain [rows, dim]
// matrix (the hidden state). Qwen3's q_norm over the q heads of a qkv row
// [N, (n_head + 2 n_kv_head) hd]: {N, n_head, hd} with ld = (n_head + 2 n_kv_head) hd
// (k_norm: the same from the first k head, with n_kv_head heads). rstd holds one value
// per vector: [rows * heads], vector (r, h) at r * heads + h. The weight has dim values,
// shared by the heads.
using ::shardlm::RmsNormShape;

// y = x * rstd * weight, rstd kept for the backward. Statistics and arithmetic in fp32
// on x as stored (x may be in a compute type); y is rounded once when stored in its
// type. y may be x's own storage when both are fp32 (in place).
void rmsnorm_forward(TypedPtr y, int64_t ld_y, float* rstd, ConstTypedPtr x, int64_t ld_x,
                     const float* weight, const RmsNormShape& shape, float eps);

// residual = a + branch + branch_bias (branch_bias may be null), then
// y = rmsnorm(residual): the residual stream is read once for both. All [N, C].
void residual_rmsnorm_forward(float* residual, TypedPtr y, float* rstd, const float* a,
                              const float* branch, const float* branch_bias, const float* weight,
                              int64_t N, int C, float eps);

// Gradients of rmsnorm_forward at the stored x (as rounded in its type) and the kept
// rstd: dx = rstd (g - x rstd^2 mean(g x)), g = dy * weight, written (accumulate_dx
// false) or added (true) to dx; dweight += sum over vectors of dy * x * rstd (dweight
// null: a frozen weight, no weight gradient), summed in
// double over fixed chunks of vectors in order, so it does not depend on the thread
// count. dx must not alias dy or x.
void rmsnorm_backward(float* dx, int64_t ld_dx, float* dweight, const float* dy, int64_t ld_dy,
                      ConstTypedPtr x, int64_t ld_x, const float* weight, const float* rstd,
                      const RmsNormShape& shape, bool accumulate_dx);

}  // namespace shardlm::cpu
