// The one reduction order every communicator uses: for each element, the ranks'
// values combined left to right in rank order, ((x_0 op x_1) op x_2) ... op x_{N-1}.
// Because an element's result depends only on that element's N inputs and this
// fixed order, it is bitwise the same however a buffer is split into collectives,
// chunks or blocks (a unit's reduce-scatter equals the matching slice of a bucket's
// all-reduce), and the same on every rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardlm/comm/counters.hpp"

namespace shardlm {

// out[i] = inputs[0][i] op inputs[1][i] op ... (rank order). `out` may be the very
// same pointer as one of the inputs (in-place use); other overlaps are not allowed.
void reduce_in_rank_order(const float* const* inputs, int num_inputs, float* out, size_t count,
                          ReduceOp op);

// The same with bf16 inputs (widened exactly), reduced in fp32. `out` must not
// overlap the inputs.
void reduce_in_rank_order(const uint16_t* const* bf16_inputs, int num_inputs, float* out,
                          size_t count, ReduceOp op);

// Same order over values gathered rank-major: gathered[r * count + i] is rank r's
// element i. `out` must not overlap `gathered`.
void reduce_gathered(const float* gathered, int num_ranks, size_t count, float* out, ReduceOp op);
void reduce_gathered(const double* gathered, int num_ranks, size_t count, double* out, ReduceOp op);
void reduce_gathered(const int64_t* gathered, int num_ranks, size_t count, int64_t* out,
                     ReduceOp op);

}  // namespace shardlm
