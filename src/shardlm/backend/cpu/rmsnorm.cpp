#include "shardlm/backend/cpu/rmsnorm.hpp"

#include "shardlm/backend/kernel_checks.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm::cpu {

namespace {

// Vectors per chunk of the weight gradient's sum: fixed, so the order of the sum is.
constexpr int64_t kChunkVectors = 256;

// One vector of x as fp32: in place for fp32 storage, else widened (exactly) into a
// per-thread scratch of dim floats that grows once. The arithmetic then runs on fp32
// pointers in every case, so a compute-type x gives bitwise the fp32 kernel's result on
// the widened values (templated on the reader, the compiler vectorizes, and contracts
// into FMAs, differently per type).
template <typename Reader>
inline const float* as_fp32(Reader in, int dim) {
  if constexpr (std::is_same_v<Reader, Fp32Reader>) {
    return in.p;
  } else {
    thread_local TrackedBuffer buffer;
    auto* wide = static_cast<float*>(buffer.grow_to(MemCategory::other, dim * sizeof(float)));
    for (int c = 0; c < dim; ++c) wide[c] = in(c);
    return wide;
  }
}

// Normalizes one vector x of dim values into `out`; returns rstd.
template <typename Writer>
inline float normalize(Writer out, const float* x, const float* weight, int dim, float eps) {
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int c = 0; c < dim; ++c) sum_sq += x[c] * x[c];
  const float r = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
#pragma omp simd
  for (int c = 0; c < dim; ++c) out(c, x[c] * r * weight[c]);
  return r;
}


// Per-call scratch for the weight gradient's per-chunk sums (double), grown once on
// the calling thread.
double* chunk_sums(size_t values) {
  thread_local TrackedBuffer buffer;
  return static_cast<double*>(buffer.grow_to(MemCategory::other, values * sizeof(double)));
}

}  // namespace

void rmsnorm_forward(TypedPtr y, int64_t ld_y, float* rstd, ConstTypedPtr x, int64_t ld_x,
                     const float* weight, const RmsNormShape& s, float eps) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_rmsnorm_shape(s, ld_y, ld_x, eps);
  const int64_t vectors = s.rows * s.heads;
  with_reader(x, [&](auto reader) {
    with_writer(y, [&](auto writer) {
#pragma omp parallel for schedule(static)
      for (int64_t v = 0; v < vectors; ++v) {
        const int64_t r = v / s.heads, column = (v % s.heads) * s.dim;
        rstd[v] = normalize(writer.at(r * ld_y + column),
                            as_fp32(reader.at(r * ld_x + column), s.dim), weight, s.dim, eps);
      }
    });
  });
}

void residual_rmsnorm_forward(float* residual, TypedPtr y, float* rstd, const float* a,
                              const float* branch, const float* branch_bias, const float* weight,
                              int64_t N, int C, float eps) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_rmsnorm_shape({N, 1, C}, C, C, eps);
  with_writer(y, [&](auto writer) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* res_row = residual + n * C;
      residual_add_bias_row(res_row, a + n * C, branch + n * C, branch_bias, C);
      rstd[n] = normalize(writer.at(n * C), res_row, weight, C, eps);
    }
  });
}

void rmsnorm_backward(float* dx, int64_t ld_dx, float* dweight, const float* dy, int64_t ld_dy,
                      ConstTypedPtr x, int64_t ld_x, const float* weight, const float* rstd,
                      const RmsNormShape& s, bool accumulate_dx) {
  const PhaseScope phase(Phase::norms_elementwise);
  check_rmsnorm_shape(s, ld_dx, ld_dy, 0.0f);
  check_rmsnorm_shape(s, ld_x, ld_x, 0.0f);
  const int dim = s.dim;
  const int64_t vectors = s.rows * s.heads;
  const int64_t num_chunks = (vectors + kChunkVectors - 1) / kChunkVectors;
  double* sums = chunk_sums(static_cast<size_t>(num_chunks) * dim);
  const float inv_dim = 1.0f / static_cast<float>(dim);
  // Offsets of vector v in a tensor with row stride ld.
  auto at = [&](int64_t v, int64_t ld) { return v / s.heads * ld + (v % s.heads) * dim; };
  with_reader(x, [&](auto reader) {
#pragma omp parallel
    {
      // Input gradient, vector by vector: dx = r (g - x r^2 mean(g x)), g = dy * weight.
#pragma omp for schedule(static) nowait
      for (int64_t v = 0; v < vectors; ++v) {
        const float* xv = as_fp32(reader.at(at(v, ld_x)), dim);
        const float* g = dy + at(v, ld_dy);
        const float r = rstd[v];
        float sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_gx)
        for (int c = 0; c < dim; ++c) sum_gx += g[c] * weight[c] * xv[c];
        const float k = r * r * r * sum_gx * inv_dim;
        float* out = dx + at(v, ld_dx);
        if (accumulate_dx) {
#pragma omp simd
          for (int c = 0; c < dim; ++c) out[c] += r * g[c] * weight[c] - k * xv[c];
        } else {
#pragma omp simd
          for (int c = 0; c < dim; ++c) out[c] = r * g[c] * weight[c] - k * xv[c];
        }
      }
      // Weight gradient (none for a frozen weight: dweight null): per chunk of vectors
      // (reads disjoint from the writes above, so no barrier is needed between the
      // loops), then the chunks in order.
      if (dweight != nullptr) {
#pragma omp for schedule(static)
      for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
        double* sum = sums + chunk * dim;
        std::fill(sum, sum + dim, 0.0);
        const int64_t end = std::min(vectors, (chunk + 1) * kChunkVectors);
        for (int64_t v = chunk * kChunkVectors; v < end; ++v) {
          const float* xv = as_fp32(reader.at(at(v, ld_x)), dim);
          const float* g = dy + at(v, ld_dy);
          const double r = rstd[v];
#pragma omp simd
          for (int c = 0; c < dim; ++c) sum[c] += double(g[c]) * double(xv[c]) * r;
        }
      }
#pragma omp for schedule(static)
      for (int c = 0; c < dim; ++c) {
        double total = 0.0;
        for (int64_t chunk = 0; chunk < num_chunks; ++chunk) total += sums[chunk * dim + c];
        dweight[c] += static_cast<float>(total);
      }
      }
    }
  });
}

}  // namespace shardlm::cpu
