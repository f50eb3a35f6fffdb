// Array conversions between element types (multi-threaded CPU kernels).
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// dst[i] = src[i] in dst's type, for n elements (multi-threaded for large n).
void convert(TypedPtr dst, ConstTypedPtr src, int64_t n);
// The same on the calling thread alone, for callers inside a parallel region (and
// charged to their phase).
void convert_in_thread(TypedPtr dst, ConstTypedPtr src, int64_t n);
// The same for a [rows, cols] matrix with row strides (elements) of its own.
void convert_rows(TypedPtr dst, int64_t ld_dst, ConstTypedPtr src, int64_t ld_src, int64_t rows,
                  int64_t cols);
// dst[i] = round_to(dtype, src[i]): fp32 storage of values representable in dtype.
void round_to(DType dtype, float* dst, const float* src, int64_t n);

}  // namespace shardlm::cpu
