// MemoryTracker: every large buffer is allocated through it with a category, so
// the trainer can report current and peak bytes per category (and `plan` can be
// checked against the measurement).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "shardlm/core/device.hpp"

namespace shardlm {

// frozen: parameters that do not train (a LoRA run's base model), wherever they are held.
enum class MemCategory : int { params = 0, grads, optimizer, activations, comm, other, frozen, count };

std::string_view to_string(MemCategory category);

class MemoryTracker {
 public:
  static constexpr int kNumCategories = static_cast<int>(MemCategory::count);

  // The process-wide tracker of host memory (one per rank).
  static MemoryTracker& global();
  // The tracker of a device's memory (the host's is global()).
  static MemoryTracker& for_device(Device device);

  void on_alloc(MemCategory category, size_t bytes);
  void on_free(MemCategory category, size_t bytes);

  size_t current(MemCategory category) const;
  size_t peak(MemCategory category) const;
  size_t current_total() const;
  size_t peak_total() const;  // peak of the sum, not the sum of peaks
  void reset_peaks();

  // {"current": {"params": N, ...}, "peak": {...}, "current_total": N, "peak_total": N}
  nlohmann::json to_json() const;

 private:
  mutable std::mutex mutex_;
  std::array<size_t, kNumCategories> current_{};
  std::array<size_t, kNumCategories> peak_{};
  size_t current_total_ = 0;
  size_t peak_total_ = 0;
};

// A 64-byte aligned, zero-initialised buffer owned by one category, on the device of
// its allocator (the host unless given). Move-only. Host pages are touched once at
// allocation (first touch is expensive in some VMs: pay it at start-up, never in the
// step loop).
class TrackedBuffer {
 public:
  TrackedBuffer() = default;
  TrackedBuffer(MemCategory category, size_t bytes, MemoryTracker& tracker = MemoryTracker::global());
  // On the allocator's device, counted by that device's tracker.
  TrackedBuffer(MemCategory category, size_t bytes, DeviceAllocator& allocator);
  ~TrackedBuffer();
  TrackedBuffer(TrackedBuffer&& other) noexcept;
  TrackedBuffer& operator=(TrackedBuffer&& other) noexcept;
  TrackedBuffer(const TrackedBuffer&) = delete;
  TrackedBuffer& operator=(const TrackedBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  Device device() const { return allocator_->device(); }
  void release();
  // Scratch that grows to the largest request, then is reused: reallocates (releasing
  // first, so the peak never holds both) only when `bytes` exceeds the current size.
  void* grow_to(MemCategory category, size_t bytes);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::other;
  MemoryTracker* tracker_ = nullptr;
  DeviceAllocator* allocator_ = &host_allocator();
};

}  // namespace shardlm
