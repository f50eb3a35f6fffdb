#include "shardlm/core/memory_tracker.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "shardlm/core/error.hpp"

namespace shardlm {

std::string_view to_string(MemCategory category) {
  switch (category) {
    case MemCategory::params: return "params";
    case MemCategory::grads: return "grads";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::comm: return "comm";
    case MemCategory::other: return "other";
    case MemCategory::frozen: return "frozen";
    case MemCategory::count: break;
  }
  return "unknown";
}

MemoryTracker& MemoryTracker::global() {
  static MemoryTracker tracker;
  return tracker;
}

MemoryTracker& MemoryTracker::for_device(Device device) {
  if (device.is_host()) return global();
  // One tracker per device, made on first use and never destroyed (buffers may outlive
  // any owner of a map).
  static std::mutex mutex;
  static std::map<std::pair<int, int>, std::unique_ptr<MemoryTracker>> trackers;
  std::lock_guard lock(mutex);
  auto& tracker = trackers[{static_cast<int>(device.kind), device.index}];
  if (!tracker) tracker = std::make_unique<MemoryTracker>();
  return *tracker;
}

void MemoryTracker::on_alloc(MemCategory category, size_t bytes) {
  std::lock_guard lock(mutex_);
  auto i = static_cast<int>(category);
  current_[i] += bytes;
  if (current_[i] > peak_[i]) peak_[i] = current_[i];
  current_total_ += bytes;
  if (current_total_ > peak_total_) peak_total_ = current_total_;
}

void MemoryTracker::on_free(MemCategory category, size_t bytes) {
  std::lock_guard lock(mutex_);
  auto i = static_cast<int>(category);
  SHARDLM_ASSERT(current_[i] >= bytes);
  current_[i] -= bytes;
  current_total_ -= bytes;
}

size_t MemoryTracker::current(MemCategory category) const {
  std::lock_guard lock(mutex_);
  return current_[static_cast<int>(category)];
}

size_t MemoryTracker::peak(MemCategory category) const {
  std::lock_guard lock(mutex_);
  return peak_[static_cast<int>(category)];
}

size_t MemoryTracker::current_total() const {
  std::lock_guard lock(mutex_);
  return current_total_;
}

size_t MemoryTracker::peak_total() const {
  std::lock_guard lock(mutex_);
  return peak_total_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard lock(mutex_);
  peak_ = current_;
  peak_total_ = current_total_;
}

nlohmann::json MemoryTracker::to_json() const {
  std::lock_guard lock(mutex_);
  nlohmann::json current = nlohmann::json::object();
  nlohmann::json peak = nlohmann::json::object();
  for (int i = 0; i < kNumCategories; ++i) {
    auto name = std::string(to_string(static_cast<MemCategory>(i)));
    current[name] = current_[i];
    peak[name] = peak_[i];
  }
  return {{"current", current}, {"peak", peak}, {"current_total", current_total_},
          {"peak_total", peak_total_}};
}

MemoryTracker& DeviceAllocator::tracker() { return MemoryTracker::for_device(device()); }

TrackedBuffer::TrackedBuffer(MemCategory category, size_t bytes, MemoryTracker& tracker)
    : bytes_(bytes), category_(category), tracker_(&tracker) {
  if (bytes == 0) return;
  data_ = allocator_->allocate(bytes, to_string(category));
  tracker_->on_alloc(category_, bytes_);
}

TrackedBuffer::TrackedBuffer(MemCategory category, size_t bytes, DeviceAllocator& allocator)
    : bytes_(bytes),
      category_(category),
      tracker_(&allocator.tracker()),
      allocator_(&allocator) {
  if (bytes == 0) return;
  data_ = allocator_->allocate(bytes, to_string(category));
  tracker_->on_alloc(category_, bytes_);
}

TrackedBuffer::~TrackedBuffer() { release(); }

void TrackedBuffer::release() {
  if (data_ != nullptr) {
    allocator_->deallocate(data_, bytes_);
    tracker_->on_free(category_, bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

TrackedBuffer::TrackedBuffer(TrackedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_),
      tracker_(other.tracker_),
      allocator_(other.allocator_) {}

TrackedBuffer& TrackedBuffer::operator=(TrackedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    tracker_ = other.tracker_;
    allocator_ = other.allocator_;
  }
  return *this;
}

void* TrackedBuffer::grow_to(MemCategory category, size_t bytes) {
  if (bytes_ < bytes) {
    release();
    *this = TrackedBuffer(category, bytes, *allocator_);
  }
  return data_;
}

}  // namespace shardlm
