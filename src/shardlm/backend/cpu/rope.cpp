#include "shardlm/backend/cpu/rope.hpp"

#include "shardlm/backend/kernel_checks.hpp"

#include <cmath>
#include <numbers>

#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

void check_rows(int64_t ld_out, int64_t ld_in, int64_t rows, int heads, int head_dim,
                const int32_t* positions, const RopeTableView& table) {
  check_rope_shape(ld_out, ld_in, rows, heads, head_dim, table);
  for (int64_t r = 0; r < rows; ++r)
    SHARDLM_CHECK(positions[r] >= 0 && positions[r] < table.max_positions,
                  "rope: position {} of row {} outside the table's [0, {})", positions[r], r,
                  table.max_positions);
}

}  // namespace

std::vector<double> rope_inverse_frequencies(int head_dim, double theta,
                                             const RopeScaling& scaling) {
  SHARDLM_CHECK(head_dim > 0 && head_dim % 2 == 0,
                "rope: head_dim must be a positive even number, got {}", head_dim);
  SHARDLM_CHECK(theta > 0, "rope: rope_theta must be positive, got {}", theta);
  const int half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] = 1.0 / std::pow(theta, 2.0 * i / head_dim);
  if (scaling.type == "default") return inv_freq;
  SHARDLM_CHECK(scaling.type == "llama3",
                "rope: rope_scaling type '{}' is not supported (expected default or llama3)",
                scaling.type);
  const double factor = scaling.factor, low = scaling.low_freq_factor,
               high = scaling.high_freq_factor;
  const double context = scaling.original_max_position_embeddings;
  SHARDLM_CHECK(factor > 0 && low > 0 && high > low && context > 0,
                "rope: llama3 rope_scaling needs factor > 0 (got {}), 0 < low_freq_factor (got {}) "
                "< high_freq_factor (got {}) and original_max_position_embeddings > 0 (got {})",
                factor, low, high, scaling.original_max_position_embeddings);
  // Wavelengths longer than context / low are slowed down by `factor`, shorter than
  // context / high kept; in between, interpolated by how many wavelengths fit the context.
  const double low_freq_wavelen = context / low, high_freq_wavelen = context / high;
  for (double& f : inv_freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f /= factor;
    } else if (!(wavelen < high_freq_wavelen)) {
      const double smooth = (context / wavelen - low) / (high - low);
      f = (1 - smooth) * f / factor + smooth * f;
    }
  }
  return inv_freq;
}

RopeTable::RopeTable(int head_dim, int max_positions, double theta, const RopeScaling& scaling,
                     MemoryTracker& tracker)
    : head_dim_(head_dim), max_positions_(max_positions) {
  const std::vector<double> inv_freq = rope_inverse_frequencies(head_dim, theta, scaling);
  SHARDLM_CHECK(max_positions > 0, "rope: the table needs at least one position, got {}",
                max_positions);
  const int half = head_dim / 2;
  const size_t entries = static_cast<size_t>(max_positions) * half;
  buffer_ = TrackedBuffer(MemCategory::other, 2 * entries * sizeof(float), tracker);
  cos_ = buffer_.as<float>();
  sin_ = cos_ + entries;
#pragma omp parallel for schedule(static)
  for (int p = 0; p < max_positions; ++p)
    for (int i = 0; i < half; ++i) {
      const double angle = p * inv_freq[static_cast<size_t>(i)];
      const size_t at = static_cast<size_t>(p) * half + i;
      cos_[at] = static_cast<float>(std::cos(angle));
      sin_[at] = static_cast<float>(std::sin(angle));
    }
}

namespace {

// y[r, h, :] = the rotation by sign * angle of x[r, h, :]: sign +1 is R, -1 is R^T
// (multiplying the sine by +-1 is exact).
template <typename Writer>
void rotate_rows(Writer writer, int64_t ld_y, const float* x, int64_t ld_x, int64_t rows,
                 int heads, int head_dim, const int32_t* positions, const RopeTableView& table,
                 float sign) {
  const int half = head_dim / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = table.cos + static_cast<int64_t>(positions[r]) * (head_dim / 2);
    const float* s = table.sin + static_cast<int64_t>(positions[r]) * (head_dim / 2);
    for (int h = 0; h < heads; ++h) {
      const float* in = x + r * ld_x + static_cast<int64_t>(h) * head_dim;
      const auto out = writer.at(r * ld_y + static_cast<int64_t>(h) * head_dim);
      // Each i reads its pair before writing it, so x may be y (fp32, in place).
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float first = in[i], second = in[i + half], sin = sign * s[i];
        out(i, first * c[i] - second * sin);
        out(i + half, second * c[i] + first * sin);
      }
    }
  }
}

}  // namespace

void rope_forward(TypedPtr y, int64_t ld_y, const float* x, int64_t ld_x, int64_t rows, int heads,
                  int head_dim, const int32_t* positions, const RopeTableView& table) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_rows(ld_y, ld_x, rows, heads, head_dim, positions, table);
  with_writer(y, [&](auto writer) {
    rotate_rows(writer, ld_y, x, ld_x, rows, heads, head_dim, positions, table, 1.0f);
  });
}

void rope_backward(float* dx, int64_t ld_dx, const float* dy, int64_t ld_dy, int64_t rows,
                   int heads, int head_dim, const int32_t* positions, const RopeTableView& table) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_rows(ld_dx, ld_dy, rows, heads, head_dim, positions, table);
  rotate_rows(Fp32Writer{dx}, ld_dx, dy, ld_dy, rows, heads, head_dim, positions, table, -1.0f);
}

}  // namespace shardlm::cpu
