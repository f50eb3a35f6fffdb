// Device: where a buffer lives and where a kernel runs. The host (the CPU backend) is
// device {cpu, 0}; a CUDA rank uses {cuda, its GPU}. {emulated, 0} is a test device:
// the CPU kernels on memory the host cannot dereference (backend/emulated), so the
// whole device path (staging, copies, per-device memory, device collectives) runs and
// is checked on a machine without a GPU. Buffers know their device through
// the DeviceAllocator that made them, and each device has its own MemoryTracker, so a
// run reports host and GPU memory by category separately.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace shardlm {

class MemoryTracker;

enum class DeviceKind { cpu, cuda, emulated };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool is_host() const { return kind == DeviceKind::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
};

// "cpu", "cuda:0", "emulated"
std::string to_string(Device device);
// "cpu" | "cuda" | "cuda:N" (N >= 0) | "emulated"; Error naming `flag` and the expected
// forms otherwise.
Device parse_device(std::string_view text, std::string_view flag = "--device");

// Makes and frees the raw memory of one device. allocate returns zero-filled memory,
// 64-byte aligned (device allocators align at least as much), or throws Error naming
// `what` and the size when the device has none left.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes, std::string_view what) = 0;
  virtual void deallocate(void* data, size_t bytes) = 0;
  // Counts what this allocator hands out: the device's tracker
  // (MemoryTracker::for_device), or a meta allocator's own (backend/meta).
  virtual MemoryTracker& tracker();
};

// The host's allocator (aligned_alloc, huge pages advised, first touch at allocation).
DeviceAllocator& host_allocator();

}  // namespace shardlm
