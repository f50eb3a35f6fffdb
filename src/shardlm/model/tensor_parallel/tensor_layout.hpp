// Tensor-parallel layout (Megatron-core's tensor_parallel/layers.py arithmetic): which
// dimension and range of every logical parameter a tensor rank holds, as pure functions.
//
// Llama families (llama, qwen2, qwen3), per decoder layer:
//   q_proj, k_proj, v_proj (weights and biases)  column-parallel: rows by attention head;
//       key/value heads split like the query heads when T divides them, else (T a multiple
//       of them) each rank holds the one key/value head its query heads read, the same
//       head replicated over T / kv_heads ranks (GQA)
//   gate_proj, up_proj                           column-parallel: rows by MLP channel
//   o_proj, down_proj                            row-parallel: columns (their input)
//   LoRA on them (lora_A, lora_B)                column-parallel base (q, k, v, gate, up):
//       A whole, B by the base's output rows; row-parallel base (o, down): A by the
//       base's input columns, B whole
//   embed_tokens, lm_head                        vocabulary-parallel: rows of the padded
//       vocabulary (padded_vocab / T each; the padding rows fall on the last ranks)
//   norms, o_proj's bias, final norm: whole (replicated)
//   QLoRA's NF4 base weights are split as the fp32 ones, each piece stored as the NF4
//   tensor of its own values (model/tensor_parallel/nf4_pieces.hpp: block for block
//   the full tensor's)
// gpt2, per block (weights stored [in, out]):
//   attn.c_attn (weight columns, bias)           column-parallel by head, inside each of
//       q, k and v (a piece of 3 groups: q|k|v stay side by side, as the kernels read them)
//   mlp.c_fc (weight columns, bias)              column-parallel: by MLP channel
//   attn.c_proj, mlp.c_proj weights              row-parallel: rows (their input)
//   wte, lm_head                                 vocabulary-parallel, as above
//   ln_1, ln_2, ln_f, the c_proj biases, wpe: whole
// Each rank's flat units hold its pieces, laid out as the unsplit unit is (q|k|v and
// gate|up still back to back), so ZeRO shards the local flat units as it shards any.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/model/config.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/model/tensor_parallel/tensor_piece.hpp"

namespace shardlm {

// One-line errors (naming --tensor-parallel, the value and what would divide) when
// `config` cannot be split over `tensor_size` ranks: a family not split yet (the MoE
// families), attention heads, key/value heads, MLP width or the padded vocabulary not
// divisible, or a QLoRA base whose split would cut NF4 blocks (check_nf4_pieces).
void check_tensor_parallel(const ModelConfig& config, int tensor_size);

// A one-line error when a model of `tensor_size` tensor ranks is built from a layout of
// another tensor split than its tensor group's.
void check_tensor_parallel_model(const ParamLayout& layout, const ModelOptions& options, int tensor_size);

// Key/value heads on each tensor rank (kv_heads / T, or 1 when they are replicated).
int tensor_local_kv_heads(const ModelConfig& config, int tensor_size);

// The piece of parameter `name` (full shape `full_shape`) on tensor rank `split.rank`,
// and its extent along the piece's dimension (the full extent when whole).
struct LocalPiece {
  TensorPiece piece;
  int64_t extent = 0;
};
LocalPiece tensor_piece_of(const ModelConfig& config, const std::string& name,
                           const std::vector<int64_t>& full_shape, TensorSplit split);

// The family's model units (each laid out from offset 0) as tensor rank split.rank holds
// them: every parameter cut to its piece (ParamInfo::piece says which), offsets laid
// out again with the same packing and alignment. split.size 1: unchanged.
std::vector<UnitLayout> split_for_tensor_rank(std::vector<UnitLayout> units,
                                              const ModelConfig& config, TensorSplit split);

// The layout another tensor rank of the same run holds: the same units, offsets and
// shapes (every rank's pieces are equally large), each piece moved to that rank's range.
// What rank 0 writes into a checkpoint's manifest for every tensor rank.
ParamLayout layout_of_tensor_rank(const ParamLayout& layout, const ModelConfig& config, int rank);

}  // namespace shardlm
