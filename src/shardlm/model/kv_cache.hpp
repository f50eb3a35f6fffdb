// KvCache: every layer's keys and values of the positions one sequence has run through
// the model so far, so that generation runs each new token through the model once
// instead of rerunning the whole context (Model::forward_unit_cached; docs/generation.md).
//
// Per layer two [capacity, kv_width] matrices in the model's compute type (keys after
// RoPE for the Llama families), on the model's device, counted as activations. A step
// over n new positions writes rows [length, length + n) of every layer, then advance(n).
#pragma once

#include <cstdint>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm {

class KvCache {
 public:
  KvCache(Backend& backend, int layers, int capacity, int64_t kv_width, DType dtype,
          MemoryTracker& tracker = MemoryTracker::global());

  int layers() const { return layers_; }
  int capacity() const { return capacity_; }
  int64_t kv_width() const { return kv_width_; }
  DType dtype() const { return dtype_; }
  // Positions held (the next step's first position).
  int length() const { return length_; }
  // Positions still free.
  int room() const { return capacity_ - length_; }

  TypedPtr keys(int layer) const;
  TypedPtr values(int layer) const;
  // Row `position` of a layer's keys / values.
  TypedPtr key_row(int layer, int position) const { return keys(layer).at(position * kv_width_); }
  TypedPtr value_row(int layer, int position) const {
    return values(layer).at(position * kv_width_);
  }

  // A step wrote n more positions (Error past the capacity).
  void advance(int n);
  // Forgets every position (the buffers stay).
  void clear() { length_ = 0; }

 private:
  int layers_ = 0, capacity_ = 0;
  int64_t kv_width_ = 0;
  DType dtype_ = DType::fp32;
  int length_ = 0;
  TrackedBuffer buffer_;  // [layers][keys, values][capacity][kv_width]
};

}  // namespace shardlm
