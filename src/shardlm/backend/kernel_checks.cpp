#include "shardlm/backend/kernel_checks.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

void check_rmsnorm_shape(const RmsNormShape& s, int64_t ld_a, int64_t ld_b, float eps) {
  SHARDLM_CHECK(s.rows >= 0 && s.heads > 0 && s.dim > 0,
                "rmsnorm: {} rows of {} heads of {} values; expected heads, dim > 0", s.rows,
                s.heads, s.dim);
  const int64_t width = static_cast<int64_t>(s.heads) * s.dim;
  SHARDLM_CHECK(ld_a >= width && ld_b >= width,
                "rmsnorm: row strides {} and {} must hold {} heads of {} values", ld_a, ld_b,
                s.heads, s.dim);
  SHARDLM_CHECK(eps >= 0.0f, "rmsnorm: eps must be non-negative, got {}", eps);
}

void check_rope_shape(int64_t ld_out, int64_t ld_in, int64_t rows, int heads, int head_dim,
                      const RopeTableView& table) {
  SHARDLM_CHECK(head_dim == table.head_dim, "rope: head_dim {} but the table was built for {}",
                head_dim, table.head_dim);
  SHARDLM_CHECK(heads > 0 && rows >= 0, "rope: {} heads and {} rows; expected heads > 0", heads,
                rows);
  const int64_t width = static_cast<int64_t>(heads) * head_dim;
  SHARDLM_CHECK(ld_out >= width && ld_in >= width,
                "rope: row strides {} and {} must hold {} heads of {} values", ld_out, ld_in,
                heads, head_dim);
}

void check_lm_head_args(const LmHeadLossArgs& a, bool want_grad) {
  SHARDLM_CHECK(a.chunk_rows > 0 && a.logits_stride >= a.V && a.V > 0,
                "lm head: bad chunking (chunk_rows {}, stride {}, vocab {})", a.chunk_rows,
                a.logits_stride, a.V);
  const bool round_dlogits = a.x.dtype != DType::fp32;
  SHARDLM_CHECK(!(want_grad && round_dlogits) || a.dlogits_scratch.dtype == a.x.dtype,
                "lm head: {} inputs need a {} dlogits scratch, got {}", dtype_name(a.x.dtype),
                dtype_name(a.x.dtype), dtype_name(a.dlogits_scratch.dtype));
}

}  // namespace shardlm
