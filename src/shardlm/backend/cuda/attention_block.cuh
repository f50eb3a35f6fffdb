// Ring attention's blocks on the GPU: the CUDA counterparts of cpu::attention_block_forward,
// attention_block_backward and attention_lse_merge (backend/cpu/attention_block.hpp), with
// the same contract and layouts. Every pointer is device memory (key_range too); the
// kernels run on `stream` and the calls return without waiting for them.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "shardlm/backend/attention_block_shape.hpp"
#include "shardlm/backend/kernel_args.hpp"

namespace shardlm::cuda {

void attention_block_forward(cudaStream_t stream, float* out, float* lse, ConstTypedPtr q,
                             int64_t ld_q, ConstTypedPtr kv, const AttentionBlockShape& s,
                             const int32_t* key_range);

// dq and dkv are ADDED to, as on the CPU.
void attention_block_backward(cudaStream_t stream, float* dq, float* dkv, const float* dout,
                              ConstTypedPtr out, const float* lse, ConstTypedPtr q, int64_t ld_q,
                              ConstTypedPtr kv, const AttentionBlockShape& s,
                              const int32_t* key_range);

void attention_lse_merge(cudaStream_t stream, float* out, float* lse, const float* block_out,
                         const float* block_lse, const AttentionBlockShape& s);

}  // namespace shardlm::cuda
