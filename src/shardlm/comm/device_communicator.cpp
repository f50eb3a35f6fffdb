#include "shardlm/comm/device_communicator.hpp"

#include <cstdlib>
#include <string>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/emulated_device_communicator.hpp"
#include "shardlm/core/error.hpp"

#ifdef SHARDLM_WITH_CUDA
#include "shardlm/comm/nccl/nccl_communicator.hpp"
#endif

namespace shardlm {

Device rank_device(Device asked, bool index_given) {
  if (asked.kind != DeviceKind::cuda || index_given) return asked;
  int local_rank = 0;
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) local_rank = std::atoi(env);
  SHARDLM_CHECK(cuda_backend_compiled(),
                "--device cuda: this shardlm was built without the CUDA backend (CMake found no "
                "nvcc; install the CUDA toolkit and rebuild)");
  const int count = cuda_device_count();
  SHARDLM_CHECK(count > 0,
                "--device cuda: no CUDA device is visible to this rank (expected at least one; "
                "check the driver and CUDA_VISIBLE_DEVICES)");
  return {DeviceKind::cuda, local_rank % count};
}

std::unique_ptr<Communicator> make_device_communicator(Device device, Communicator& world) {
  switch (device.kind) {
    case DeviceKind::cpu:
      return nullptr;
    case DeviceKind::emulated:
      return std::make_unique<EmulatedDeviceCommunicator>(world);
    case DeviceKind::cuda: {
#ifdef SHARDLM_WITH_CUDA
      // Over a copy of the world (split), which the NCCL communicator owns and uses
      // for bootstrap and host buffers. Collectives are ordered after the kernels of
      // this device's backend (its stream is non-blocking: the legacy default stream
      // would not order them).
      NcclOptions nccl;
      nccl.device = device.index;
      nccl.compute_stream = backend_for(device).stream_handle();
      return NcclCommunicator::create(world.split(0, world.rank(), world.name()), world.options(),
                                      nccl);
#else
      throw Error(fmt::format("--device {}: this shardlm was built without CUDA (no NCCL)",
                              to_string(device)));
#endif
    }
  }
  return nullptr;
}

}  // namespace shardlm
