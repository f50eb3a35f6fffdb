#include "shardlm/backend/cuda/kernel_launch.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm::cuda {

void check_kernel_launch(const char* kernel, const char* file, int line) {
  const cudaError_t error = cudaGetLastError();
  SHARDLM_CHECK(error == cudaSuccess, "CUDA kernel {} failed to launch: {} ({}:{})", kernel,
                cudaGetErrorString(error), file, line);
}

void throw_kernel_argument_error(const std::string& message) { throw Error(message); }

}  // namespace shardlm::cuda
