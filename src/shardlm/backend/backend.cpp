#include "shardlm/backend/backend.hpp"

#include <map>
#include <memory>
#include <mutex>

#include "shardlm/backend/emulated/emulated_backend.hpp"
#include "shardlm/core/error.hpp"

#ifdef SHARDLM_WITH_CUDA
#include "shardlm/backend/cuda/cuda_backend.hpp"
#endif

namespace shardlm {

void Backend::attention_forward_cached(TypedPtr, ConstTypedPtr, int64_t, ConstTypedPtr,
                                       ConstTypedPtr, int64_t, const AttentionShape&, int) {
  throw Error(fmt::format("generation with a KV cache is not implemented on {} (it runs on "
                          "the CPU)", description()));
}

bool cuda_backend_compiled() {
#ifdef SHARDLM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef SHARDLM_WITH_CUDA
  return cuda::visible_device_count();
#else
  return 0;
#endif
}

TrackedBuffer allocate_on(Backend& backend, MemCategory category, size_t bytes,
                          MemoryTracker& host_tracker) {
  if (backend.device().is_host() && !backend.is_meta())
    return TrackedBuffer(category, bytes, host_tracker);
  return TrackedBuffer(category, bytes, backend.allocator());
}

Backend& backend_for(Device device) {
  if (device.is_host()) return cpu_backend();
  if (device.kind == DeviceKind::emulated) return emulated::backend();
  SHARDLM_CHECK(cuda_backend_compiled(),
                "--device {}: this shardlm was built without the CUDA backend (CMake found no "
                "nvcc; install the CUDA toolkit and rebuild)",
                to_string(device));
  const int count = cuda_device_count();
  SHARDLM_CHECK(device.index < count,
                "--device {}: this machine has {} CUDA device(s) visible (expected an index "
                "below that; check CUDA_VISIBLE_DEVICES and the driver)",
                to_string(device), count);
#ifdef SHARDLM_WITH_CUDA
  // One backend per GPU for the life of the process (buffers outlive any owner).
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Backend>> backends;
  std::lock_guard lock(mutex);
  auto& backend = backends[device.index];
  if (!backend) backend = cuda::make_backend(device.index);
  return *backend;
#else
  throw Error("unreachable");
#endif
}

}  // namespace shardlm
