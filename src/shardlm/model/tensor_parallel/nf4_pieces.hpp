// QLoRA's NF4 base weights split over tensor ranks (docs/parallelism.md "Tensor
// parallelism"). NF4 (backend/cpu/nf4.hpp) cuts a tensor flattened row-major into blocks
// of 64 values, each with its own fp32 absmax (not double-quantized). A piece is stored
// as the NF4 tensor of its own values, flattened row-major; when every run of the piece
// in the full tensor starts and ends on a block boundary of the full tensor, its blocks
// are whole blocks of the full tensor, so its absmax words and codes are exactly what
// quantizing the full tensor gives for those rows or columns, block for block. Shapes
// whose split would cut a block are refused (check_nf4_pieces).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardlm/model/config.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/model/tensor_parallel/tensor_piece.hpp"

namespace shardlm {

// True when the piece (its local shape) is made of whole NF4 blocks of the full tensor:
// its runs in the full tensor, and the full tensor itself, start and end on multiples
// of 64 values. A whole tensor always is.
bool nf4_blocks_exact(const TensorPiece& piece, const std::vector<int64_t>& local_shape);

// One-line error (naming --tensor-parallel, --quantize-base, the tensor, its shape and
// the piece's run of values) when a QLoRA model's NF4 weights cannot be split over
// `tensor_size` ranks block for block. Nothing to check without nf4 or at T = 1.
void check_nf4_pieces(const ModelConfig& config, int tensor_size);

// TensorPiece::for_each_run in storage elements: elements [local_begin, local_end) of a
// piece stored as `storage` (fp32: its values; nf4: its storage words) as runs
// contiguous in both the piece's and the full tensor's storage:
// run(full_begin, local_begin, count). For nf4 the absmax words come first, then the
// code words, each in increasing order; the piece must be nf4_blocks_exact.
void for_each_storage_run(const TensorPiece& piece, ParamStorage storage,
                          const std::vector<int64_t>& local_shape, int64_t local_begin,
                          int64_t local_end,
                          const std::function<void(int64_t, int64_t, int64_t)>& run);

// Elements a tensor of `values` values occupies in `storage` (NF4: its storage words).
int64_t storage_numel(ParamStorage storage, int64_t values);

// Elements the full tensor occupies in `storage`.
int64_t full_storage_numel(const TensorPiece& piece, ParamStorage storage,
                           const std::vector<int64_t>& local_shape);

}  // namespace shardlm
