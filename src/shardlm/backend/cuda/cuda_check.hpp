// Checks for CUDA runtime and cuBLASLt calls (host code compiled by g++; nvcc cannot
// compile fmt's compile-time format strings, so the .cu launchers return their status
// and the backend checks it here). A failure throws shardlm::Error naming the call, the
// place and CUDA's own description of the error.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "shardlm/core/error.hpp"

namespace shardlm::cuda {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw Error(fmt::format("CUDA error: {} failed at {}:{}: {} ({})", call, file, line,
                          cudaGetErrorString(status), cudaGetErrorName(status)));
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(fmt::format("cuBLASLt error: {} failed at {}:{}: {} ({})", call, file, line,
                          cublasLtGetStatusString(status), cublasLtGetStatusName(status)));
}

}  // namespace shardlm::cuda

#define SHARDLM_CUDA_CHECK(call) ::shardlm::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define SHARDLM_CUBLAS_CHECK(call) ::shardlm::cuda::check_cublas((call), #call, __FILE__, __LINE__)
