#include "shardlm/model/tensor_parallel/nf4_pieces.hpp"

#include <algorithm>

#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

namespace {

constexpr int64_t kBlock = cpu::kNf4BlockSize;
// Values per 4-byte word of NF4 codes (two 4-bit codes a byte).
constexpr int64_t kValuesPerCodeWord = 8;

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Elements after the piece's dimension (a run's values per index along it).
int64_t inner_extent(const TensorPiece& piece, const std::vector<int64_t>& local_shape) {
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(piece.dim) + 1; d < local_shape.size(); ++d) inner *= local_shape[d];
  return inner;
}

}  // namespace

bool nf4_blocks_exact(const TensorPiece& piece, const std::vector<int64_t>& local_shape) {
  if (piece.whole()) return true;
  const int64_t inner = inner_extent(piece, local_shape);
  const int64_t extent = local_shape[static_cast<size_t>(piece.dim)];
  // Runs start at (outer * full + g * full / groups + begin) * inner and hold
  // extent / groups * inner values (one group of a fused piece at a time).
  return piece.begin * inner % kBlock == 0 && extent / piece.groups * inner % kBlock == 0 &&
         piece.full / piece.groups * inner % kBlock == 0;
}

void check_nf4_pieces(const ModelConfig& config, int tensor_size) {
  if (config.quantize_base != BaseQuant::nf4 || tensor_size == 1) return;
  const int T = tensor_size;
  for (const UnitLayout& unit : model_family(config.family).model_units(config))
    for (const ParamInfo& p : unit.params) {
      if (p.storage != ParamStorage::nf4) continue;
      for (int t = 0; t < T; ++t) {
        const LocalPiece local = tensor_piece_of(config, p.name, p.shape, {T, t});
        if (local.piece.whole()) continue;
        std::vector<int64_t> shape = p.shape;
        shape[static_cast<size_t>(local.piece.dim)] = local.extent;
        if (nf4_blocks_exact(local.piece, shape)) continue;
        const int64_t run = local.extent * inner_extent(local.piece, shape);
        throw Error(fmt::format(
            "--tensor-parallel {} with --quantize-base nf4: tensor rank {} would hold {} of the {} "
            "{} of {} [{} x {}], runs of {} values from value {} of the tensor, which cut NF4's "
            "blocks of {} values (a rank's NF4 words must be the whole tensor's, block for "
            "block); use a --tensor-parallel for which every split run is a multiple of {} "
            "values, or --tensor-parallel 1",
            T, t, local.extent, p.shape[static_cast<size_t>(local.piece.dim)],
            local.piece.dim == 0 ? "rows" : "columns", p.name, p.shape[0], p.shape[1], run,
            local.piece.begin * inner_extent(local.piece, shape), kBlock, kBlock));
      }
    }
}

void for_each_storage_run(const TensorPiece& piece, ParamStorage storage,
                          const std::vector<int64_t>& local_shape, int64_t local_begin,
                          int64_t local_end,
                          const std::function<void(int64_t, int64_t, int64_t)>& run) {
  if (storage == ParamStorage::fp32 || piece.whole()) {
    piece.for_each_run(local_shape, local_begin, local_end, run);
    return;
  }
  SHARDLM_ASSERT(nf4_blocks_exact(piece, local_shape));
  const int64_t local_n = product(local_shape), full_n = product(piece.full_shape(local_shape));
  const int64_t local_blocks = local_n / kBlock, full_blocks = full_n / kBlock;
  // A run of words (full, local, count), cut to [local_begin, local_end).
  auto clipped = [&](int64_t full, int64_t local, int64_t count) {
    const int64_t lo = std::max(local_begin, local), hi = std::min(local_end, local + count);
    if (lo < hi) run(full + (lo - local), lo, hi - lo);
  };
  // Each run of values is whole blocks: its absmax words, then its code words.
  piece.for_each_run(local_shape, 0, local_n, [&](int64_t full, int64_t local, int64_t n) {
    clipped(full / kBlock, local / kBlock, n / kBlock);
  });
  piece.for_each_run(local_shape, 0, local_n, [&](int64_t full, int64_t local, int64_t n) {
    clipped(full_blocks + full / kValuesPerCodeWord, local_blocks + local / kValuesPerCodeWord,
            n / kValuesPerCodeWord);
  });
}

int64_t storage_numel(ParamStorage storage, int64_t values) {
  return storage == ParamStorage::nf4 ? cpu::nf4_storage_words(values) : values;
}

int64_t full_storage_numel(const TensorPiece& piece, ParamStorage storage,
                           const std::vector<int64_t>& local_shape) {
  return storage_numel(storage, product(piece.full_shape(local_shape)));
}

}  // namespace shardlm
