// Launch plumbing of shardlm's own .cu kernels (attention.cu, cross_entropy.cu).
//
// nvcc (CUDA 13, C++20) cannot compile {fmt} 9's consteval format strings, nor
// dtype.hpp's _Float16 helpers, so .cu files include neither core/error.hpp's macros
// nor call those helpers: their errors are formatted and thrown by kernel_launch.cpp,
// which the host compiler builds.
//
// SHARDLM_LAUNCH_KERNEL is the one place a .cu file spells a launch, so that the
// kernels also compile as plain C++ under SHARDLM_CUDA_EMULATION, where
// tests/cuda_emulation runs them as fibers on the host (to check their index arithmetic,
// masking and synchronisation on machines without a GPU).
#pragma once

#include <string>

#include <cuda_runtime.h>

namespace shardlm::cuda {

// Throws shardlm::Error "CUDA kernel <kernel> failed to launch: <reason> (<file>:<line>)"
// when cudaGetLastError reports an error for this thread's last launch.
void check_kernel_launch(const char* kernel, const char* file, int line);

// Throws shardlm::Error(message): bad arguments of a kernel's host entry point.
[[noreturn]] void throw_kernel_argument_error(const std::string& message);

}  // namespace shardlm::cuda

#ifdef SHARDLM_CUDA_EMULATION
#define SHARDLM_LAUNCH_KERNEL(name, kernel, grid, block, stream, ...)               \
  do {                                                                               \
    (void)(stream);                                                                  \
    ::shardlm_emulation::launch(grid, block, [&] { kernel(__VA_ARGS__); });          \
    ::shardlm::cuda::check_kernel_launch(name, __FILE__, __LINE__);                  \
  } while (0)
#else
// kernel: a function (or a pointer to one; template instances through a local pointer,
// as a macro argument cannot hold their commas).
#define SHARDLM_LAUNCH_KERNEL(name, kernel, grid, block, stream, ...)  \
  do {                                                                \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__);            \
    ::shardlm::cuda::check_kernel_launch(name, __FILE__, __LINE__);   \
  } while (0)
#endif
