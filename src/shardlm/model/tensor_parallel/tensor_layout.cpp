#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

#include <string_view>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/tensor_parallel/nf4_pieces.hpp"

namespace shardlm {

namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

bool splits_llama_family(const ModelConfig& config) {
  return config.family == "llama" || config.family == "qwen2" || config.family == "qwen3";
}

// gpt2 (weights stored [in, out] as Hugging Face's Conv1D does): c_attn's columns are
// q|k|v side by side, each by head; c_fc's by MLP channel; the c_proj weights' rows are
// their input (row-parallel); c_proj's biases, the norms and wpe stay whole.
LocalPiece gpt2_piece_of(const ModelConfig& config, const std::string& name,
                         const std::vector<int64_t>& full_shape, TensorSplit split) {
  const int T = split.size, t = split.rank;
  auto piece = [&](int dim, int64_t begin, int64_t extent, int groups = 1) {
    SHARDLM_ASSERT(dim < static_cast<int>(full_shape.size()));
    return LocalPiece{TensorPiece{dim, begin, full_shape[static_cast<size_t>(dim)], groups}, extent};
  };
  const int64_t attention = config.n_embd / T;    // this rank's heads' width
  const int64_t mlp = int64_t{4} * config.n_embd / T;
  if (ends_with(name, "attn.c_attn.weight")) return piece(1, t * attention, 3 * attention, 3);
  if (ends_with(name, "attn.c_attn.bias")) return piece(0, t * attention, 3 * attention, 3);
  if (ends_with(name, "attn.c_proj.weight")) return piece(0, t * attention, attention);
  if (ends_with(name, "mlp.c_fc.weight")) return piece(1, t * mlp, mlp);
  if (ends_with(name, "mlp.c_fc.bias")) return piece(0, t * mlp, mlp);
  if (ends_with(name, "mlp.c_proj.weight")) return piece(0, t * mlp, mlp);
  if (name == "transformer.wte.weight" || name == "lm_head.weight") {
    const int64_t rows = full_shape.front() / T;
    return piece(0, t * rows, rows);
  }
  return LocalPiece{TensorPiece{}, full_shape.empty() ? 1 : full_shape.front()};
}

}  // namespace

void check_tensor_parallel(const ModelConfig& config, int tensor_size) {
  SHARDLM_CHECK(tensor_size >= 1, "--tensor-parallel must be at least 1, got {}", tensor_size);
  if (tensor_size == 1) return;
  const int T = tensor_size;
  SHARDLM_CHECK(splits_llama_family(config) || config.family == "gpt2",
                "--tensor-parallel {}: the {} family is not split over tensor ranks yet (gpt2, "
                "llama, qwen2 and qwen3 are); use --tensor-parallel 1", T, config.family);
  SHARDLM_CHECK(config.n_head % T == 0,
                "--tensor-parallel {} must divide the {} attention heads of the model ({}); "
                "use a divisor of {}", T, config.n_head, config.shape_description(), config.n_head);
  const int kv = config.kv_heads();
  SHARDLM_CHECK(kv % T == 0 || T % kv == 0,
                "--tensor-parallel {}: the model's {} key/value heads must be a multiple of it "
                "(each rank its own) or divide it (each replicated over T / {} ranks)", T, kv, kv);
  SHARDLM_CHECK(config.mlp_width() % T == 0,
                "--tensor-parallel {} must divide the MLP width {} of the model ({})", T,
                config.mlp_width(), config.shape_description());
  SHARDLM_CHECK(config.padded_vocab_size() % T == 0,
                "--tensor-parallel {} must divide the model's vocabulary of {} rows ({} tokens "
                "padded to a multiple of {}); use a divisor of {}", T, config.padded_vocab_size(),
                config.vocab_size, ModelConfig::kVocabPadMultiple, config.padded_vocab_size());
  check_nf4_pieces(config, T);
}

void check_tensor_parallel_model(const ParamLayout& layout, const ModelOptions& options, int tensor_size) {
  const Communicator* group = options.parallel_groups.tensor;
  SHARDLM_CHECK(layout.tensor.size == tensor_size && (group == nullptr || layout.tensor.rank == group->rank()),
                "model: the layout holds tensor rank {} of {}, the model's tensor group is rank {} of {}",
                layout.tensor.rank, layout.tensor.size, group != nullptr ? group->rank() : 0, tensor_size);
}

int tensor_local_kv_heads(const ModelConfig& config, int tensor_size) {
  const int kv = config.kv_heads();
  return kv % tensor_size == 0 ? kv / tensor_size : 1;
}

LocalPiece tensor_piece_of(const ModelConfig& config, const std::string& name,
                           const std::vector<int64_t>& full_shape, TensorSplit split) {
  SHARDLM_ASSERT(split.size >= 1 && split.rank >= 0 && split.rank < split.size);
  const int T = split.size, t = split.rank;
  const int64_t hd = config.head_dim();
  auto piece = [&](int dim, int64_t begin, int64_t extent) {
    SHARDLM_ASSERT(dim < static_cast<int>(full_shape.size()));
    return LocalPiece{TensorPiece{dim, begin, full_shape[static_cast<size_t>(dim)]}, extent};
  };
  if (T > 1 && config.family == "gpt2") return gpt2_piece_of(config, name, full_shape, split);
  if (T > 1) {
    const int64_t q_rows = config.n_head / T * hd;
    const int kv_local = tensor_local_kv_heads(config, T);
    // The first key/value head this rank's query heads read.
    const int64_t kv_first = config.kv_heads() % T == 0
                                 ? static_cast<int64_t>(t) * kv_local
                                 : t / (T / config.kv_heads());
    const int64_t mlp = config.mlp_width() / T;
    for (const char* q : {"self_attn.q_proj.weight", "self_attn.q_proj.bias"})
      if (ends_with(name, q)) return piece(0, t * q_rows, q_rows);
    for (const char* kv : {"self_attn.k_proj.weight", "self_attn.k_proj.bias",
                           "self_attn.v_proj.weight", "self_attn.v_proj.bias"})
      if (ends_with(name, kv)) return piece(0, kv_first * hd, kv_local * hd);
    if (ends_with(name, "self_attn.o_proj.weight")) return piece(1, t * q_rows, q_rows);
    for (const char* gu : {"mlp.gate_proj.weight", "mlp.up_proj.weight"})
      if (ends_with(name, gu)) return piece(0, t * mlp, mlp);
    if (ends_with(name, "mlp.down_proj.weight")) return piece(1, t * mlp, mlp);
    // LoRA: a column-parallel base's B by its output rows (A whole), a row-parallel
    // base's A by its input columns (B whole).
    if (ends_with(name, "self_attn.q_proj.lora_B.weight")) return piece(0, t * q_rows, q_rows);
    for (const char* kv : {"self_attn.k_proj.lora_B.weight", "self_attn.v_proj.lora_B.weight"})
      if (ends_with(name, kv)) return piece(0, kv_first * hd, kv_local * hd);
    for (const char* gu : {"mlp.gate_proj.lora_B.weight", "mlp.up_proj.lora_B.weight"})
      if (ends_with(name, gu)) return piece(0, t * mlp, mlp);
    if (ends_with(name, "self_attn.o_proj.lora_A.weight")) return piece(1, t * q_rows, q_rows);
    if (ends_with(name, "mlp.down_proj.lora_A.weight")) return piece(1, t * mlp, mlp);
    // Vocabulary-parallel: rows of the (padded) vocabulary, the padding on the last ranks.
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      const int64_t rows = full_shape.front() / T;
      return piece(0, t * rows, rows);
    }
  }
  return LocalPiece{TensorPiece{}, full_shape.empty() ? 1 : full_shape.front()};
}

std::vector<UnitLayout> split_for_tensor_rank(std::vector<UnitLayout> units,
                                              const ModelConfig& config, TensorSplit split) {
  if (split.size == 1) return units;
  check_tensor_parallel(config, split.size);
  for (UnitLayout& unit : units) {
    int64_t end = 0;            // the new layout's end so far
    for (ParamInfo& p : unit.params) {
      // Packed parameters (q|k|v, gate|up) stay packed: the kernels read them as one matrix.
      const bool packed = p.packed_with_previous;
      const LocalPiece local = tensor_piece_of(config, p.name, p.shape, split);
      if (!local.piece.whole()) {
        p.shape[static_cast<size_t>(local.piece.dim)] = local.extent;
        p.piece = local.piece;
        p.numel = storage_numel(p.storage, p.logical_numel());
      }
      p.offset = packed ? end : round_up(end, ParamLayout::kParamAlignment);
      end = p.offset + p.numel;
    }
    unit.numel = end;
  }
  return units;
}

ParamLayout layout_of_tensor_rank(const ParamLayout& layout, const ModelConfig& config, int rank) {
  SHARDLM_CHECK(rank >= 0 && rank < layout.tensor.size,
                "tensor rank {} is outside a tensor dimension of {}", rank, layout.tensor.size);
  ParamLayout out = layout;
  out.tensor.rank = rank;
  for (UnitLayout& unit : out.units)
    for (ParamInfo& p : unit.params)
      if (!p.piece.whole())
        p.piece = tensor_piece_of(config, p.name, p.piece.full_shape(p.shape), out.tensor).piece;
  return out;
}

}  // namespace shardlm
