// The CUDA backend (compiled when CMake finds nvcc; SHARDLM_WITH_CUDA): the Backend
// table on one GPU, with cuBLASLt GEMMs and shardlm's own .cu kernels, all on one
// stream per backend. Host code never includes CUDA headers through this file.
#pragma once

#include <memory>

#include "shardlm/backend/backend.hpp"

namespace shardlm::cuda {

// GPUs the CUDA runtime sees (0 when it finds no driver or no device; never throws).
int visible_device_count();
// The backend of GPU `index` (selects that device on the calling thread).
std::unique_ptr<Backend> make_backend(int index);

}  // namespace shardlm::cuda
