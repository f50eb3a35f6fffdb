#include "shardlm/model/kv_cache.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

KvCache::KvCache(Backend& backend, int layers, int capacity, int64_t kv_width, DType dtype,
                 MemoryTracker& tracker)
    : layers_(layers), capacity_(capacity), kv_width_(kv_width), dtype_(dtype) {
  SHARDLM_CHECK(layers > 0 && capacity > 0 && kv_width > 0,
                "KV cache: layers {}, capacity {} and width {} must be positive", layers,
                capacity, kv_width);
  const size_t bytes = 2 * static_cast<size_t>(layers) * static_cast<size_t>(capacity) *
                       static_cast<size_t>(kv_width) * dtype_bytes(dtype);
  buffer_ = allocate_on(backend, MemCategory::activations, bytes, tracker);
}

TypedPtr KvCache::keys(int layer) const {
  SHARDLM_CHECK(layer >= 0 && layer < layers_, "KV cache: layer {} outside [0, {})", layer,
                layers_);
  return TypedPtr(buffer_.data(), dtype_).at(2 * static_cast<int64_t>(layer) * capacity_ * kv_width_);
}

TypedPtr KvCache::values(int layer) const {
  return keys(layer).at(static_cast<int64_t>(capacity_) * kv_width_);
}

void KvCache::advance(int n) {
  SHARDLM_CHECK(n >= 0 && n <= room(), "KV cache: {} more positions do not fit ({} of {} used)",
                n, length_, capacity_);
  length_ += n;
}

}  // namespace shardlm
