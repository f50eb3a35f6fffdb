// A rank's device and the communicator that carries that device's memory: on the host
// the world communicator itself; on the emulated device its wrapper over the host's
// (emulated_device_communicator.hpp); on CUDA an NCCL communicator bootstrapped over the host's.
#pragma once

#include <memory>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/device.hpp"

namespace shardlm {

// `cuda` without an index: the GPU of this rank's node-local rank (Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK, else 0), modulo the GPUs visible; an explicit cuda:N is
// kept. Other devices as they are.
Device rank_device(Device asked, bool index_given);

// nullptr for the host (use `world`); else a communicator over the same ranks for
// buffers on `device`. Error naming the device when this build cannot talk over it.
std::unique_ptr<Communicator> make_device_communicator(Device device, Communicator& world);

}  // namespace shardlm
