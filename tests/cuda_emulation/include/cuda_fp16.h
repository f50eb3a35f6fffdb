// A stand-in for <cuda_fp16.h> under SHARDLM_CUDA_EMULATION (see cuda_runtime.h here):
// the conversions the kernels use, on GCC's _Float16 (round to nearest even).
#pragma once

#include <bit>
#include <cstdint>

using __half = _Float16;
inline __half __ushort_as_half(unsigned short bits) { return std::bit_cast<__half>(bits); }
inline unsigned short __half_as_ushort(__half value) {
  return std::bit_cast<unsigned short>(value);
}
inline float __half2float(__half value) { return static_cast<float>(value); }
inline __half __float2half_rn(float value) { return static_cast<__half>(value); }
