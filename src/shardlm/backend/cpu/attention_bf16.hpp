// bf16 causal attention on avx512_bf16 dot products (vdpbf16ps: two bf16 products
// accumulated into each fp32 lane, twice the multiply-adds of an fp32 FMA), for the
// attention kernels of attention.hpp when qkv and out are bf16. Internal to the CPU
// backend: call it only where bf16_dot_products_available().
//
// Same blocking, online softmax and saved log-sum-exp as the fp32 kernels; what
// differs is where values are rounded to bf16, as in bf16 flash attention: every
// product runs on bf16 operands with fp32 accumulation, so the probabilities P, the
// output gradient dout and the score gradient dS are rounded to bf16 before the
// products that read them (q, k, v and out are bf16 already). Scores, softmax
// statistics, lse and all accumulators are fp32; dqkv is fp32.
#pragma once

#include <cstdint>

namespace shardlm::cpu {

// Whether this CPU executes avx512_bf16 (checked once at run time).
bool bf16_dot_products_available();

// As attention_forward / attention_backward, qkv and out bf16 (raw bits). head_dim
// (C / H) must be even.
void attention_forward_bf16_dot(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T,
                                int C, int H);
void attention_backward_bf16_dot(float* dqkv, const float* dout, const uint16_t* qkv,
                                 const uint16_t* out, const float* lse, int B, int T, int C,
                                 int H);

}  // namespace shardlm::cpu
