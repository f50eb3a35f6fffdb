// Kernels of NcclCommunicator's rank-ordered reductions (ordered_reduce.cu). Plain
// C++ declarations: streams travel as void* (cudaStream_t) and the operator as the
// int value of shardlm::ReduceOp, so that neither side includes the other's headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardlm::nccl {

// out[i] = bf16 bits of in[i], rounded to nearest even (NaN stays NaN), bit for bit
// what core/dtype.hpp's float_to_bf16 gives on the CPU.
void launch_round_to_bf16(const float* in, uint16_t* out, size_t count, void* stream);

// out[i] = ((b_0[i] op b_1[i]) op b_2[i]) ... op b_{n-1}[i] in fp32, where b_r is block r
// of `blocks` (`count` elements each; fp32, or bf16 bits when blocks_are_bf16): the
// left-to-right rank order of shardlm's CPU reductions (reduce_kernels.cpp), hence
// the same bits. op: 0 sum, 1 max, 2 min (shardlm::ReduceOp). `out` may be any
// block-sized buffer except one inside `blocks`.
void launch_ordered_reduce(const void* blocks, bool blocks_are_bf16, size_t count, int num_blocks,
                           int op, float* out, void* stream);

}  // namespace shardlm::nccl
