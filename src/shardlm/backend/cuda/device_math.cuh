// Device-side element types and math shared by shardlm's CUDA kernels (nvcc only).
//
// Element types: a kernel is templated on tag types (F32, Bf16, Fp16) that load a
// stored element as fp32 and store an fp32 value rounded once, with the same rules as
// core/dtype.hpp's writers: bf16 rounds to nearest even with NaN quieted exactly as
// float_to_bf16 does (the bit pattern, not just "a NaN"), fp16 rounds to nearest even
// (cvt.rn; overflow becomes inf). So a stored bf16 activation is bitwise the CPU's.
//
// Math: exp_approx and tanh_approx are the CPU's fast_math.hpp formulas, operation for
// operation (the same clamps, so e.g. a sigmoid is never NaN), and nvcc's default
// division and sqrtf are IEEE-rounded. Compilers may fuse a multiply and an add
// differently on the two sides (GCC contracts in the C++ build, nvcc here), so
// polynomial kernels (GELU, SwiGLU) agree with the CPU to a few ulps, not bit for bit;
// sums, conversions and AdamW (whose fmas are explicit on both sides) have no
// contraction left to differ and give the CPU's values.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "shardlm/backend/kernel_args.hpp"
#include "shardlm/core/dtype.hpp"

// Launches `kernel` (a __global__ function or a pointer to one: template instances go
// through a local pointer, as a macro argument cannot hold their commas). Under
// SHARDLM_CUDA_EMULATION (tests/cuda_emulation: the kernels compiled as C++ and run on
// host threads, 1-D blocks of whole warps) the same kernels run on the host, which is
// how test_backend_kernels_emulated checks them on machines without a GPU.
#ifdef SHARDLM_CUDA_EMULATION
#include <bit>
#define SHARDLM_KERNEL(kernel, grid, block, stream, ...)                                \
  do {                                                                                   \
    (void)(stream);                                                                      \
    ::shardlm_emulation::launch(dim3(grid), dim3(block), [&] { (kernel)(__VA_ARGS__); }); \
  } while (0)
#define __constant__
inline float __int_as_float(int value) { return std::bit_cast<float>(value); }
#else
#define SHARDLM_KERNEL(kernel, grid, block, stream, ...) \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

namespace shardlm::cuda::device {

__device__ __forceinline__ uint16_t float_to_bf16_bits(float value) {
  uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t value) {
  return __uint_as_float(static_cast<uint32_t>(value) << 16);
}
__device__ __forceinline__ uint16_t float_to_fp16_bits(float value) {
  return __half_as_ushort(__float2half_rn(value));
}
__device__ __forceinline__ float fp16_bits_to_float(uint16_t value) {
  return __half2float(__ushort_as_half(value));
}

// Element type tags: Storage is what memory holds; load widens (exactly), store
// rounds once, round(v) is what a store and reload would give.
struct F32 {
  using Storage = float;
  static constexpr DType kType = DType::fp32;
  __device__ static float load(const Storage* p, int64_t i) { return p[i]; }
  __device__ static void store(Storage* p, int64_t i, float v) { p[i] = v; }
  __device__ static float round(float v) { return v; }
};
struct Bf16 {
  using Storage = uint16_t;
  static constexpr DType kType = DType::bf16;
  __device__ static float load(const Storage* p, int64_t i) { return bf16_bits_to_float(p[i]); }
  __device__ static void store(Storage* p, int64_t i, float v) { p[i] = float_to_bf16_bits(v); }
  __device__ static float round(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }
};
struct Fp16 {
  using Storage = uint16_t;
  static constexpr DType kType = DType::fp16;
  __device__ static float load(const Storage* p, int64_t i) { return fp16_bits_to_float(p[i]); }
  __device__ static void store(Storage* p, int64_t i, float v) { p[i] = float_to_fp16_bits(v); }
  __device__ static float round(float v) { return fp16_bits_to_float(float_to_fp16_bits(v)); }
};

// Calls f(tag) with the tag of `type` (host side: picks the kernel instance).
template <typename F>
void with_type(DType type, F&& f) {
  switch (type) {
    case DType::fp32:
      f(F32{});
      return;
    case DType::bf16:
      f(Bf16{});
      return;
    case DType::fp16:
      f(Fp16{});
      return;
  }
}

template <typename T>
__device__ __forceinline__ typename T::Storage* storage(void* p) {
  return static_cast<typename T::Storage*>(p);
}
template <typename T>
__device__ __forceinline__ const typename T::Storage* storage(const void* p) {
  return static_cast<const typename T::Storage*>(p);
}

// fast_math.hpp's exp_approx: e^x on [-87, 88] (inputs clamped), ~2 ulp.
__device__ __forceinline__ float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float kRoundMagic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRoundMagic) - kRoundMagic;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return y * __int_as_float((static_cast<int32_t>(n) + 127) << 23);
}

__device__ __forceinline__ float tanh_approx(float x) {
  const float e = exp_approx(-2.0f * fabsf(x));
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

// Sums a float over a warp by xor butterflies: every lane ends with the same bits (each
// step adds the same two values in either order, and IEEE addition is commutative).
// (fp32 only: double sums go through shared memory, which the emulation also runs.)
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Whether a tensor rank's vocabulary rows hold token (or target) t.
__device__ __forceinline__ bool vocab_shard_holds(VocabShardRows shard, int32_t t) {
  return t >= shard.begin && t < shard.begin + shard.real;
}

// Grid-stride loop bounds: the first index of this thread and the stride.
__device__ __forceinline__ int64_t grid_first() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The launch shape of the grid-stride kernels: kGridThreads a block, and enough blocks to
// fill an H200 (132 SMs x 2048 threads) several times; larger arrays loop, so the grid
// size never depends on more than n.
constexpr int kGridThreads = 256;
inline int grid_blocks(int64_t n) {
  constexpr int64_t kMaxBlocks = 132 * 8 * 4;
  const int64_t blocks = (n + kGridThreads - 1) / kGridThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace shardlm::cuda::device
