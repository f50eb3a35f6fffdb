// Causal self-attention on the GPU: the CUDA counterpart of cpu::attention_forward /
// attention_backward (backend/cpu/attention.hpp), with the same contract: layouts
// qkv [B*T, (n_head + 2 n_kv_head) hd], out [B*T, n_head hd], lse [B, n_head, T]
// (natural log), scale 1/sqrt(hd), causal always, GQA, key_begin per token (null: 0),
// dqkv OVERWRITTEN; qkv and out fp32, bf16 or fp16 (one type for both), lse, dout and
// dqkv fp32; arithmetic in fp32, out rounded once when stored. Every pointer is device
// memory; the kernels run on `stream` and the calls return without waiting for them.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/dtype.hpp"

namespace shardlm::cuda {

void attention_forward(cudaStream_t stream, TypedPtr out, float* lse, ConstTypedPtr qkv,
                       const AttentionShape& s, const int32_t* key_begin);

// A KV cache's step (cpu::attention_forward_cached's contract: s.B == 1, the s.T new
// queries at positions [past, past + s.T), q [s.T, ld_q], k and v [past + s.T, ld_kv],
// out [s.T, n_head hd], one storage type for all four): each new position gets the bits
// attention_forward gives it over the whole sequence.
void attention_forward_cached(cudaStream_t stream, TypedPtr out, ConstTypedPtr q, int64_t ld_q,
                              ConstTypedPtr k, ConstTypedPtr v, int64_t ld_kv, const AttentionShape& s,
                              int past);

// The device scratch attention_backward needs for `s`: 0 for multi-head attention, else
// each query head's k and v gradients (2 B T n_head hd floats), summed per group.
size_t attention_backward_scratch_bytes(const AttentionShape& s);

// gqa_scratch: attention_backward_scratch_bytes(s) of device memory (null when that is 0),
// used by the queued kernels until they have run.
void attention_backward(cudaStream_t stream, float* dqkv, const float* dout, ConstTypedPtr qkv,
                        ConstTypedPtr out, const float* lse, const AttentionShape& s,
                        const int32_t* key_begin, float* gqa_scratch);

}  // namespace shardlm::cuda
