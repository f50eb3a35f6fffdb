// TensorPiece: which part of a logical (Hugging Face) tensor one tensor-parallel rank
// holds (docs/parallelism.md "Tensor parallelism"). A piece is a contiguous range along
// one dimension of the full tensor; dim -1 is the whole tensor (replicated on every
// tensor rank). The checkpoint, init and export speak of the full tensor, the flat
// units and the kernels of the piece: this is the table between them.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace shardlm {

struct TensorPiece {
  int dim = -1;        // -1: the whole tensor; 0: rows; 1: columns
  int64_t begin = 0;   // first index along dim that this rank holds (inside each group)
  int64_t full = 0;    // the full tensor's extent along dim (0 when dim is -1)
  int groups = 1;      // equal parts of dim, each holding its own [begin, begin + extent / groups)

  bool whole() const { return dim < 0; }
  // The full tensor's shape, given the piece's (local) shape.
  std::vector<int64_t> full_shape(const std::vector<int64_t>& local_shape) const;
  // Row-major index in the full tensor of element `local` of the piece (local_shape).
  int64_t full_index(const std::vector<int64_t>& local_shape, int64_t local) const;
  // Elements [local_begin, local_end) of the piece as runs contiguous in both the piece
  // and the full tensor: run(full_begin, local_begin, count), in increasing order.
  void for_each_run(const std::vector<int64_t>& local_shape, int64_t local_begin,
                    int64_t local_end,
                    const std::function<void(int64_t, int64_t, int64_t)>& run) const;
  bool operator==(const TensorPiece&) const = default;
};

// The tensor dimension of the mesh as a layout sees it: `size` ranks split every block,
// this one is coordinate `rank` (parallel/mesh_shape.hpp: the innermost dimension).
struct TensorSplit {
  int size = 1;
  int rank = 0;
  bool operator==(const TensorSplit&) const = default;
};

}  // namespace shardlm
