// Rotary position embeddings (RoPE) in Hugging Face's convention (rotate_half): in each
// head of head_dim values, element i pairs with element i + head_dim/2 and the pair is
// rotated by the angle position * inv_freq[i]:
//   y[i]        = x[i] cos - x[i + half] sin
//   y[i + half] = x[i + half] cos + x[i] sin          (i < half = head_dim / 2)
// inv_freq[i] = theta^(-2i / head_dim), optionally rescaled as Llama 3.1 does
// (rope_scaling type "llama3": transformers' _compute_llama3_parameters). The angles
// and their cosines and sines are computed in double and stored in fp32 tables, once.
#pragma once

#include "shardlm/backend/kernel_args.hpp"

#include <cstdint>
#include <vector>

#include "shardlm/core/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/rope_scaling.hpp"

namespace shardlm::cpu {

// The head's inverse frequencies, in double: head_dim / 2 values (Error for an odd or
// non-positive head_dim, theta <= 0, an unknown scaling type or llama3 fields that
// make no band: factor <= 0, high_freq_factor <= low_freq_factor, ...).
std::vector<double> rope_inverse_frequencies(int head_dim, double theta,
                                             const RopeScaling& scaling);

// cos and sin of position p * inv_freq[i] for p in [0, max_positions), i < head_dim / 2,
// as two fp32 tables [max_positions, head_dim / 2] (MemCategory::other). Size it to the
// run's context length: 8 max_positions head_dim bytes.
class RopeTable {
 public:
  RopeTable(int head_dim, int max_positions, double theta, const RopeScaling& scaling,
            MemoryTracker& tracker = MemoryTracker::global());

  int head_dim() const { return head_dim_; }
  int max_positions() const { return max_positions_; }
  // Row p of the tables: head_dim / 2 values each.
  const float* cos_row(int p) const { return cos_ + static_cast<int64_t>(p) * (head_dim_ / 2); }
  const float* sin_row(int p) const { return sin_ + static_cast<int64_t>(p) * (head_dim_ / 2); }
  RopeTableView view() const { return {cos_, sin_, head_dim_, max_positions_}; }
  // The host table is its own view (the CPU kernels read it in place).
  operator RopeTableView() const { return view(); }  // NOLINT(google-explicit-constructor)
  // The cos then sin tables, one after another (what a device copy of the table holds).
  const float* data() const { return cos_; }
  int64_t values() const { return static_cast<int64_t>(max_positions_) * head_dim_; }

 private:
  int head_dim_;
  int max_positions_;
  TrackedBuffer buffer_;
  float* cos_ = nullptr;
  float* sin_ = nullptr;
};

// y[r, h, :] = rotate(x[r, h, :], positions[r]) for rows r < rows and heads h < heads,
// head h of row r at x + r * ld_x + h * head_dim (ld in elements; likewise y). y is in
// the compute type (rotated in fp32, rounded once when stored); x is fp32 and may be
// y's own storage when y is fp32 (in place). head_dim must be the table's, and
// 0 <= positions[r] < max_positions (Error otherwise). Charged to norms_elementwise.
void rope_forward(TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x, int64_t rows, int heads,
                  int head_dim, const int32_t* positions, const RopeTableView& table);

// dx = R(position)^T dy, the backward of rope_forward (fp32; dx may be dy, in place).
void rope_backward(float* dx, int64_t ld_dx, const float* dy, int64_t ld_dy, int64_t rows,
                   int heads, int head_dim, const int32_t* positions, const RopeTableView& table);

}  // namespace shardlm::cpu
