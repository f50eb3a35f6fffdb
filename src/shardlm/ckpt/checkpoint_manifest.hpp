// A checkpoint's manifest.json as data, and the checks that make it safe to load
// from: every field a load depends on (where each tensor lies in its unit, where
// each shard's slices lie in its file and in the unit) is parsed, range-checked and
// cross-checked before a single weight is read. Format: docs/checkpoint-format.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardlm/model/config.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm {

// Version 2 added the per-checkpoint commit marker (checkpoint_commit.hpp).
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr const char* kCheckpointFormatName = "shardlm-checkpoint";
// Per element a shard stores fp32 master weights, AdamW first and second moment.
inline constexpr int kCheckpointStates = 3;

// Everything a resume needs besides the tensors.
struct CheckpointInfo {
  int64_t step = 0;         // steps completed
  int64_t tokens_seen = 0;
  ModelConfig model;
  std::string tokenizer;    // tokenizer spec ("byte", "gpt2:DIR")
  std::string strategy;
  int world_size = 1;
  nlohmann::json train;     // training options that must match on resume, and RNG states
};

struct ManifestUnit {
  std::string name;
  int tensor_rank = 0;  // tensor parallelism: the tensor rank whose pieces the unit holds
  int64_t numel = 0;
  int64_t padded_numel = 0;
};

struct ManifestTensor {
  std::string name;
  std::vector<int64_t> shape;
  int unit = 0;
  int64_t offset = 0;  // elements into the unit's flat buffer
  int64_t numel = 0;   // elements it occupies (an NF4 tensor: its storage words)
  ParamStorage storage = ParamStorage::fp32;
  // Tensor parallelism: which part of the logical tensor this entry's elements are
  // (whole without it); the same name appears once per tensor rank.
  TensorPiece piece;
  int tensor_rank = 0;
};

// Elements [begin, end) of `unit`, stored from byte `file_offset` of the shard file:
// master, adam_m, adam_v, (end - begin) floats each.
struct ManifestSlice {
  int unit = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t file_offset = 0;
};

struct ManifestShard {
  std::string file;  // a plain name inside the checkpoint directory
  int rank = 0;
  int64_t bytes = 0;
  std::string sha256;
  std::vector<ManifestSlice> slices;
};

struct CheckpointManifest {
  CheckpointInfo info;
  std::vector<ManifestUnit> units;
  std::vector<ManifestTensor> tensors;  // canonical order: unit order, then offset order
  std::vector<ManifestShard> shards;
};

// The manifest's "units" array for a layout: with tensor parallelism, the units of every
// tensor rank (layout_of_tensor_rank), rank after rank, each parameter with its piece.
nlohmann::json layout_to_manifest_units(const ParamLayout& layout, const ModelConfig& config);
nlohmann::json manifest_to_json(const CheckpointInfo& info, const nlohmann::json& units,
                                const nlohmann::json& shards);

// Parses a manifest and checks it completely; Error naming `path` and the field
// otherwise. Checked: types and ranges of every number; the tensors are exactly
// those of the recorded model's layout (names and shapes, in order), each inside
// its unit, none overlapping; every shard's slices are laid out back to back from
// byte 0 and add up to its byte count; the shards' slices together cover every
// unit's [0, padded_numel) exactly once. Format and version are checked first, so
// a newer format is reported as such.
CheckpointManifest parse_checkpoint_manifest(const nlohmann::json& manifest,
                                             const std::string& path);

// Checks only the format name and version (Error naming `path`: not a manifest, a
// newer version, or an older one this shardlm no longer reads). parse_checkpoint_manifest
// starts with it; readers call it first so a version problem is reported as such.
void check_manifest_format(const nlohmann::json& manifest, const std::string& path);

}  // namespace shardlm
