// ParamLayout: the flat-unit data layout (docs/architecture.md "Flat units"), as pure functions.
//
// The model is cut into model units (the family's: model/family.hpp), for every family
// so far 0 the embeddings, 1..n_layer the transformer blocks, n_layer+1 the final norm
// (and an untied LM head). Parameters live in flat
// units: one contiguous buffer per unit, the granularity of all-gather,
// reduce-scatter and prefetch. Usually a unit holds one model unit; model units
// smaller than min_unit_params are merged with a neighbour into one unit so tiny
// layers (GPT-2's final norm: 2 x n_embd values) do not become tiny messages. Each
// parameter is a view (offset, shape) into its unit's buffer, named as Hugging Face
// names it, so import/export is a table. Offsets are aligned to kParamAlignment
// elements (cache lines, SIMD), and a unit is padded to a multiple of world_size *
// kParamAlignment so every rank owns an equal, aligned slice [r*S, (r+1)*S).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/model/config.hpp"
#include "shardlm/model/tensor_parallel/tensor_piece.hpp"

namespace shardlm {

// How a parameter's values are stored in its flat unit. fp32: one element per value.
// nf4: a frozen base weight of a QLoRA run, 4-bit NormalFloat with per-block absmax
// (backend/cpu/nf4.hpp), occupying nf4_storage_words(logical count) 4-byte elements
// that are bytes, not floats: never rounded, converted, summed or updated.
enum class ParamStorage { fp32, nf4 };

// How a parameter starts (model/family.hpp init_param_range): normal (std init_std),
// uniform (in [-init_std, init_std]), zeros or ones.
enum class ParamInit { zeros, ones, normal, uniform };

struct ParamInfo {
  std::string name;            // Hugging Face name, e.g. transformer.h.3.attn.c_attn.weight
  std::vector<int64_t> shape;  // logical shape (row-major); see padded rows below
  int64_t offset = 0;          // element offset inside the unit's flat buffer
  int64_t numel = 0;           // elements it occupies in the flat buffer (fp32: product of shape)
  ParamStorage storage = ParamStorage::fp32;
  bool weight_decay = false;   // AdamW decoupled decay applies (2-D weights only)
  // For the token embedding, rows >= valid_rows (vocabulary padding) are zero at init
  // and stay zero.
  ParamInit init = ParamInit::zeros;
  float init_std = 0.0f;
  int64_t valid_rows = -1;     // -1: all rows are real
  // Laid out right after the previous parameter, unaligned (q|k|v, gate|up: one matrix).
  bool packed_with_previous = false;
  // Tensor parallelism: the part of the logical tensor this rank holds (shape is the
  // piece's; piece.full_shape(shape) the tensor's as checkpoints and Hugging Face name it).
  TensorPiece piece;
  int64_t logical_numel() const;  // product of shape (values, whatever the storage)
  bool quantized() const { return storage != ParamStorage::fp32; }
};

struct UnitLayout {
  std::string name;  // "embeddings", "h.3", "final"
  std::vector<ParamInfo> params;
  // Frozen units (a LoRA run's base model) have parameters but no gradients, no
  // optimizer state and nothing to reduce; units of different trainability are never
  // merged into one flat unit.
  bool trainable = true;
  // Raw units hold a quantized tensor (so also bytes, not floats): frozen, handed to
  // the model as stored (fp32-tagged words), never rounded to the compute type, and
  // never merged with other units. Their fp32 tensors (norm weights) are ordinary.
  bool raw = false;
  // The share of a micro-batch's tokens its matrices multiply, on average: 1, or
  // top_k / num_experts for a mixture-of-experts expert (plan's FLOPs).
  double token_fraction = 1.0;
  // A mixture-of-experts expert's unit: its index among its layer's `experts` (-1:
  // not an expert). Expert parallelism places it on one coordinate of the expert
  // dimension (FlatUnitStrategy::expert_holder); experts are never merged.
  int expert = -1;
  int experts = 0;
  int64_t numel = 0;         // end of the last parameter (before padding)
  int64_t padded_numel = 0;  // multiple of world_size * kParamAlignment
  int64_t shard_numel(int world_size) const { return padded_numel / world_size; }
  const ParamInfo& param(const std::string& name) const;  // throws Error if absent
};

// Where a model unit's parameters live: in unit `unit`, from element `base` on. A
// model unit's parameter offsets relative to `base` do not depend on merging.
struct ModelUnitPlacement {
  int unit = 0;
  int64_t base = 0;
};

struct ParamLayout {
  static constexpr int64_t kParamAlignment = 16;  // elements (64 bytes of fp32)

  std::vector<UnitLayout> units;                  // flat (communication) units
  std::vector<ModelUnitPlacement> model_units;    // indexed by model unit
  int world_size = 1;
  // The tensor rank whose pieces these are (model/tensor_parallel/tensor_layout.hpp).
  TensorSplit tensor;

  static ParamLayout build(const ModelConfig& config, int world_size, int64_t min_unit_params = 0,
                           TensorSplit tensor = {});

  int num_units() const { return static_cast<int>(units.size()); }
  int num_model_units() const { return static_cast<int>(model_units.size()); }
  // Offset of parameter `name` relative to its model unit's base.
  int64_t offset_in_model_unit(int model_unit, const std::string& name) const;
  int64_t total_numel() const;         // real parameters (excluding alignment padding)
  int64_t total_padded_numel() const;  // what the flat buffers hold
  // Every parameter, in canonical order (unit order, then offset order).
  std::vector<const ParamInfo*> all_params() const;
  // Locate a parameter by name: returns (unit index, info) or throws Error.
  std::pair<int, const ParamInfo*> find(const std::string& name) const;
};

}  // namespace shardlm
