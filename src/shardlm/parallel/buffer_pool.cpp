#include "shardlm/parallel/buffer_pool.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

BufferPool::BufferPool(int count, MemCategory category, size_t bytes_each,
                       MemoryTracker& tracker, Backend& backend) {
  for (int slot = 0; slot < count; ++slot) {
    buffers_.push_back(allocate_on(backend, category, bytes_each, tracker));
    free_slots_.push_back(slot);
  }
}

int BufferPool::acquire() {
  SHARDLM_ASSERT(has_free());
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void BufferPool::release(int slot) { free_slots_.push_back(slot); }

}  // namespace shardlm
