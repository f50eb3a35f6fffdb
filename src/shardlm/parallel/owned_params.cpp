#include "shardlm/parallel/owned_params.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

// Compute-type storage is converted through fp32 pieces of this many values (4 MiB),
// so a large embedding never needs an fp32 copy of its own.
constexpr int64_t kStagingValues = int64_t{1} << 20;

void check_range(const OwnedSlice& s, int64_t first, int64_t n) {
  SHARDLM_ASSERT(n >= 0 && first >= s.begin && first + n <= s.end);
  SHARDLM_ASSERT((s.master == nullptr) != (s.stored.data == nullptr));
}

}  // namespace

void read_owned_params(const OwnedSlice& s, int64_t first, int64_t n, float* out) {
  check_range(s, first, n);
  if (s.master != nullptr) {
    std::memcpy(out, s.master + (first - s.begin), static_cast<size_t>(n) * sizeof(float));
    return;
  }
  cpu_backend().convert(TypedPtr(out), s.stored.at(first - s.begin), n);
}

void write_owned_params(const OwnedSlice& s, int64_t first, int64_t n, const float* values) {
  check_range(s, first, n);
  if (s.master != nullptr) {
    std::memcpy(s.master + (first - s.begin), values, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  cpu_backend().convert(s.stored.at(first - s.begin), values, n);
}

void zero_owned_params(const OwnedSlice& s) {
  // +0.0 is all zero bits in fp32, bf16 and fp16 alike.
  void* data = s.master != nullptr ? static_cast<void*>(s.master) : s.stored.data;
  const DType type = s.master != nullptr ? DType::fp32 : s.stored.dtype;
  std::memset(data, 0, static_cast<size_t>(s.size()) * dtype_bytes(type));
}

void init_owned_params(const Model& model, int unit, uint64_t seed, const OwnedSlice& s) {
  if (s.master != nullptr) {
    model.init_range(unit, seed, s.begin, s.end, s.master);
    return;
  }
  // Init is a function of (seed, parameter, element): piece by piece gives the same values.
  std::vector<float> staging(static_cast<size_t>(std::min(kStagingValues, s.size())));
  for (int64_t lo = s.begin; lo < s.end; lo += kStagingValues) {
    const int64_t hi = std::min(s.end, lo + kStagingValues);
    model.init_range(unit, seed, lo, hi, staging.data());
    write_owned_params(s, lo, hi - lo, staging.data());
  }
}

void for_each_owned_params(const OwnedSlice& s,
                           const std::function<void(int64_t first, int64_t n, const float*)>& visit) {
  if (s.master != nullptr) {
    visit(s.begin, s.size(), s.master);
    return;
  }
  std::vector<float> staging(static_cast<size_t>(std::min(kStagingValues, s.size())));
  for (int64_t lo = s.begin; lo < s.end; lo += kStagingValues) {
    const int64_t hi = std::min(s.end, lo + kStagingValues);
    read_owned_params(s, lo, hi - lo, staging.data());
    visit(lo, hi - lo, staging.data());
  }
}

}  // namespace shardlm
