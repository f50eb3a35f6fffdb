// BufferPool: equal-sized buffers lent to flat units for a while and given back:
// zero3/hybrid's gather buffers (a unit's gathered parameters while it is in use) and
// zero2/zero3's transient gradient buffers (a unit's full gradient from its backward
// until its reduce-scatter finished). plan_buffers sizes a pool once at start-up, so a
// run allocates nothing later; when a pool is empty the schedule must first finish
// whatever holds a buffer.
#pragma once

#include <cstddef>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm {

class BufferPool {
 public:
  BufferPool() = default;
  // On the backend's device (host: counted by `tracker`).
  BufferPool(int count, MemCategory category, size_t bytes_each, MemoryTracker& tracker,
             Backend& backend = cpu_backend());

  int size() const { return static_cast<int>(buffers_.size()); }
  bool has_free() const { return !free_slots_.empty(); }
  // Lends a free buffer and returns its slot, which release() takes back. Requires
  // has_free().
  int acquire();
  void release(int slot);
  void* data(int slot) { return buffers_[static_cast<size_t>(slot)].data(); }

 private:
  std::vector<TrackedBuffer> buffers_;
  std::vector<int> free_slots_;  // the slot released last is lent first
};

}  // namespace shardlm
