#include "shardlm/model/tensor_parallel/tensor_piece.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

std::vector<int64_t> TensorPiece::full_shape(const std::vector<int64_t>& local_shape) const {
  if (whole()) return local_shape;
  SHARDLM_ASSERT(dim < static_cast<int>(local_shape.size()));
  std::vector<int64_t> shape = local_shape;
  shape[static_cast<size_t>(dim)] = full;
  return shape;
}

int64_t TensorPiece::full_index(const std::vector<int64_t>& local_shape, int64_t local) const {
  if (whole()) return local;
  // Elements after dim (the inner stride) and the local extent along dim.
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < local_shape.size(); ++d) inner *= local_shape[d];
  const int64_t extent = local_shape[static_cast<size_t>(dim)];
  const int64_t outer = local / (extent * inner);
  const int64_t along = (local / inner) % extent;
  const int64_t within = local % inner;
  // Along dim: the along-th held index is in group along / group_extent.
  const int64_t group_extent = extent / groups;
  const int64_t full_along = along / group_extent * (full / groups) + begin + along % group_extent;
  return (outer * full + full_along) * inner + within;
}

void TensorPiece::for_each_run(const std::vector<int64_t>& local_shape, int64_t local_begin,
                               int64_t local_end,
                               const std::function<void(int64_t, int64_t, int64_t)>& run) const {
  if (local_begin >= local_end) return;
  if (whole()) {
    run(local_begin, local_begin, local_end - local_begin);
    return;
  }
  // A run is what lies along dim (inside one group) and after it: extent / groups x inner
  // elements in the piece.
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < local_shape.size(); ++d) inner *= local_shape[d];
  const int64_t block = local_shape[static_cast<size_t>(dim)] / groups * inner;
  for (int64_t at = local_begin; at < local_end;) {
    const int64_t block_end = (at / block + 1) * block;
    const int64_t end = block_end < local_end ? block_end : local_end;
    run(full_index(local_shape, at), at, end - at);
    at = end;
  }
}

}  // namespace shardlm
