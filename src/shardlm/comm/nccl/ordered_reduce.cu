// Rank-ordered reductions for NcclCommunicator's reproducible path: NCCL's ring and
// tree sums add in an order that depends on the topology; these add blocks strictly
// left to right in fp32, like the CPU communicators, so results match them bitwise.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "shardlm/comm/nccl/ordered_reduce.hpp"

namespace shardlm::nccl {

namespace {

constexpr int kThreads = 256;

// Same arithmetic as core/dtype.hpp's float_to_bf16 / bf16_to_float.
__device__ __forceinline__ uint16_t to_bf16_bits(float value) {
  uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
__device__ __forceinline__ float from_bf16_bits(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const uint16_t* p) { return from_bf16_bits(*p); }

__global__ void round_to_bf16_kernel(const float* in, uint16_t* out, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = to_bf16_bits(in[i]);
}

// The operator is a template parameter so the inner loop has no branch; the sum is a
// plain add (__fadd_rn: never contracted into an FMA).
template <typename T, int Op>
__global__ void ordered_reduce_kernel(const T* blocks, size_t count, int num_blocks, float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc = load(blocks + i);
    for (int r = 1; r < num_blocks; ++r) {
      const float x = load(blocks + static_cast<size_t>(r) * count + i);
      if constexpr (Op == 0) acc = __fadd_rn(acc, x);
      if constexpr (Op == 1) acc = x > acc ? x : acc;
      if constexpr (Op == 2) acc = x < acc ? x : acc;
    }
    out[i] = acc;
  }
}

unsigned grid_for(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

template <typename T>
void launch_typed(const T* blocks, size_t count, int num_blocks, int op, float* out,
                  cudaStream_t stream) {
  switch (op) {
    case 0:
      ordered_reduce_kernel<T, 0><<<grid_for(count), kThreads, 0, stream>>>(blocks, count, num_blocks, out);
      break;
    case 1:
      ordered_reduce_kernel<T, 1><<<grid_for(count), kThreads, 0, stream>>>(blocks, count, num_blocks, out);
      break;
    case 2:
      ordered_reduce_kernel<T, 2><<<grid_for(count), kThreads, 0, stream>>>(blocks, count, num_blocks, out);
      break;
    default:
      throw std::runtime_error("ordered reduce: unknown operator " + std::to_string(op));
  }
}

}  // namespace

void launch_round_to_bf16(const float* in, uint16_t* out, size_t count, void* stream) {
  if (count == 0) return;
  round_to_bf16_kernel<<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, count);
  check_launch("round to bf16 kernel");
}

void launch_ordered_reduce(const void* blocks, bool blocks_are_bf16, size_t count, int num_blocks,
                           int op, float* out, void* stream) {
  if (count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (blocks_are_bf16)
    launch_typed(static_cast<const uint16_t*>(blocks), count, num_blocks, op, out, s);
  else
    launch_typed(static_cast<const float*>(blocks), count, num_blocks, op, out, s);
  check_launch("ordered reduce kernel");
}

}  // namespace shardlm::nccl
