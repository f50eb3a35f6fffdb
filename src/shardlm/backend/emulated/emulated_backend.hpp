// The emulated device (Device{emulated, 0}): the CPU kernels run on "device memory"
// that the host cannot dereference. A device pointer is a host address with bit 62
// set, which is not a canonical address on x86-64 (nor a valid one on AArch64), so a
// host read or write through it faults at once, while pointer arithmetic on it works as
// on any device pointer. Each kernel of the table untags its device arguments (and
// fails, naming the kernel, when handed host memory instead) and runs the CPU kernel.
//
// Why: the device path (arrays staged to the device, copies back for checkpoints,
// memory counted per device, collectives on device buffers) must be right before a GPU
// ever runs it; this device runs that path on any machine, and bitwise like the CPU.
#pragma once

#include <cstdint>

#include "shardlm/backend/backend.hpp"

namespace shardlm::emulated {

inline constexpr uintptr_t kDeviceTag = uintptr_t{1} << 62;

inline bool is_device_pointer(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & kDeviceTag) != 0;
}
// The host address behind an emulated device pointer (null stays null); Error naming
// `what` when p is host memory.
const void* host_address(const void* p, const char* what);
template <typename T>
T* host_view(T* p, const char* what) {
  return static_cast<T*>(const_cast<void*>(host_address(p, what)));
}

Backend& backend();

}  // namespace shardlm::emulated
