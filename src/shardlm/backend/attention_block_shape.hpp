// The shape of one block of ring attention (backend/cpu/attention_block.hpp): q_len
// queries of each batch row over kv_len keys and values of another block of the same
// rows. (Its own header, not kernel_args.hpp: the CUDA sources include that one and
// have no ring kernels.)
#pragma once

#include <cstdint>

namespace shardlm {

struct AttentionBlockShape {
  int B = 0;
  int q_len = 0, kv_len = 0;  // per batch row
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  int group_size() const { return n_head / n_kv_head; }
  int64_t q_columns() const { return static_cast<int64_t>(n_head) * head_dim; }
  int64_t kv_columns() const { return static_cast<int64_t>(2 * n_kv_head) * head_dim; }  // k | v
};

}  // namespace shardlm
