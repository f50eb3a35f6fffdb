// CheckpointReader: verification on open, then reads by tensor name from whichever
// shards hold the elements.
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/checkpoint_commit.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/model/tensor_parallel/nf4_pieces.hpp"
#include "shardlm/parallel/owned_params.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

nlohmann::json parse_manifest_text(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("checkpoint manifest '{}' is not valid JSON: {}", path, e.what()));
  }
}

void verify_shard(const std::string& path, const ManifestShard& shard) {
  SHARDLM_CHECK(fs::exists(path), "checkpoint shard '{}' is missing", path);
  const auto actual_bytes = static_cast<int64_t>(fs::file_size(path));
  SHARDLM_CHECK(actual_bytes == shard.bytes,
                "checkpoint shard '{}' has {} bytes, the manifest expects {} (truncated or "
                "corrupt)",
                path, actual_bytes, shard.bytes);
  SHARDLM_CHECK(sha256_file_hex(path) == shard.sha256,
                "checkpoint shard '{}' fails its sha256 check (corrupt)", path);
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  SHARDLM_CHECK(fs::exists(manifest_path), "checkpoint '{}' has no manifest.json", dir);
  const std::string text = read_text_file(manifest_path);
  const nlohmann::json json = parse_manifest_text(text, manifest_path);
  check_manifest_format(json, manifest_path);
  const CommitMarker marker = read_commit_marker(dir);
  SHARDLM_CHECK(sha256_hex(text.data(), text.size()) == marker.manifest_sha256,
                "checkpoint manifest '{}' does not match the sha256 in its commit marker "
                "(damaged)",
                manifest_path);
  manifest_ = parse_checkpoint_manifest(json, manifest_path);
  SHARDLM_CHECK(marker.step == manifest_.info.step,
                "checkpoint '{}': its commit marker is for step {}, the manifest for step {}",
                dir, marker.step, manifest_.info.step);
  for (const auto& shard : manifest_.shards)
    verify_shard((fs::path(dir) / shard.file).string(), shard);
  // The logical tensors, once each (tensor rank 0 holds a piece of every one).
  for (const auto& t : manifest_.tensors)
    if (t.tensor_rank == 0) tensors_.emplace_back(t.name, t.piece.full_shape(t.shape));
}

std::vector<const ManifestTensor*> CheckpointReader::locate(const std::string& name) const {
  std::vector<const ManifestTensor*> entries;
  for (const auto& t : manifest_.tensors)
    if (t.name == name) entries.push_back(&t);
  SHARDLM_CHECK(!entries.empty(), "checkpoint '{}' has no tensor named '{}'", dir_, name);
  return entries;
}

void CheckpointReader::read_unit_range(int unit, StateKind kind, int64_t begin, int64_t count,
                                       float* out) const {
  const int64_t end = begin + count;
  int64_t covered = 0;
  for (const auto& shard : manifest_.shards) {
    std::optional<File> file;
    for (const auto& sl : shard.slices) {
      if (sl.unit != unit) continue;
      const int64_t lo = std::max(begin, sl.begin);
      const int64_t hi = std::min(end, sl.end);
      if (lo >= hi) continue;
      if (!file) file = File::open_read((fs::path(dir_) / shard.file).string());
      const int64_t slice_len = sl.end - sl.begin;
      const int64_t element = static_cast<int64_t>(kind) * slice_len + (lo - sl.begin);
      file->read_at(out + (lo - begin), static_cast<size_t>(hi - lo) * sizeof(float),
                    sl.file_offset + element * static_cast<int64_t>(sizeof(float)));
      covered += hi - lo;
    }
  }
  // The manifest was checked to cover every unit exactly once when it was opened.
  SHARDLM_ASSERT(covered == count);
}

void CheckpointReader::read(const std::string& name, StateKind kind, int64_t begin, int64_t count,
                            float* out) const {
  const std::vector<const ManifestTensor*> entries = locate(name);
  const ManifestTensor& first = *entries.front();
  if (first.piece.whole()) {  // one entry, or a tensor every tensor rank holds whole
    SHARDLM_ASSERT(begin >= 0 && begin + count <= first.numel);
    read_unit_range(first.unit, kind, first.offset + begin, count, out);
    return;
  }
  // Pieces: each one's runs that fall in the range (replicated pieces, GQA's key/value
  // heads over more tensor ranks, hold the same values: read again, harmlessly).
  const int64_t end = begin + count;
  for (const ManifestTensor* t : entries)
    for_each_storage_run(t->piece, t->storage, t->shape, 0, t->numel, [&](int64_t full, int64_t local, int64_t n) {
      const int64_t lo = std::max(begin, full), hi = std::min(end, full + n);
      if (lo < hi) read_unit_range(t->unit, kind, t->offset + local + (lo - full), hi - lo, out + (lo - begin));
    });
}

int64_t CheckpointReader::stored_numel(const std::string& name) const {
  const ManifestTensor& t = *locate(name).front();
  return t.piece.whole() ? t.numel : full_storage_numel(t.piece, t.storage, t.shape);
}

void CheckpointReader::read_piece(const ParamInfo& p, StateKind kind, int64_t begin, int64_t count,
                                  float* out) const {
  for_each_storage_run(p.piece, p.storage, p.shape, begin, begin + count, [&](int64_t full, int64_t local, int64_t n) {
    read(p.name, kind, full, n, out + (local - begin));
  });
}

void CheckpointReader::load_into(const ParamLayout& layout, OwnedState& state) const {
  for (const auto* p : layout.all_params()) {
    bool found = false;
    for (const auto& t : manifest_.tensors) {
      if (t.name != p->name) continue;
      found = true;
      const std::vector<int64_t> shape = t.piece.full_shape(t.shape), expected = p->piece.full_shape(p->shape);
      SHARDLM_CHECK(shape == expected,
                    "checkpoint '{}' tensor '{}' has shape [{}], the model expects [{}]", dir_,
                    t.name, fmt::join(shape, ", "), fmt::join(expected, ", "));
      SHARDLM_CHECK(t.storage == p->storage,
                    "checkpoint '{}' tensor '{}' is stored as {}, the model expects {} "
                    "(--quantize-base must match the checkpoint's)", dir_, t.name,
                    t.storage == ParamStorage::nf4 ? "nf4" : "fp32",
                    p->storage == ParamStorage::nf4 ? "nf4" : "fp32");
    }
    SHARDLM_CHECK(found, "checkpoint '{}' has no tensor '{}' that the model needs", dir_, p->name);
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice s = state.owned(u);
    zero_owned_params(s);
    float* moments[] = {s.adam_m, s.adam_v};
    for (auto* state : moments)  // a frozen unit has no optimizer state to load
      if (state != nullptr) std::memset(state, 0, static_cast<size_t>(s.size()) * sizeof(float));
    std::vector<float> staging;
    for (const auto& p : layout.units[static_cast<size_t>(u)].params) {
      const int64_t lo = std::max(s.begin, p.offset);
      const int64_t hi = std::min(s.end, p.offset + p.numel);
      if (lo >= hi) continue;
      if (s.master != nullptr) {
        read_piece(p, StateKind::master, lo - p.offset, hi - lo, s.master + (lo - s.begin));
      } else {
        // A frozen unit stored in the compute type: rounded (to nearest even) piece by
        // piece, as its compute copy would have been.
        constexpr int64_t kPiece = int64_t{1} << 20;
        for (int64_t a = lo; a < hi; a += kPiece) {
          const int64_t b = std::min(hi, a + kPiece);
          staging.resize(static_cast<size_t>(b - a));
          read_piece(p, StateKind::master, a - p.offset, b - a, staging.data());
          write_owned_params(s, a, b - a, staging.data());
        }
      }
      for (int k = 1; k < kCheckpointStates; ++k)
        if (moments[k - 1] != nullptr)
          read_piece(p, static_cast<StateKind>(k), lo - p.offset, hi - lo, moments[k - 1] + (lo - s.begin));
    }
  }
  state.after_load();
}

std::string CheckpointReader::optimizer_digest() const {
  Sha256 hasher;
  std::vector<float> buffer;
  for (StateKind kind : {StateKind::adam_m, StateKind::adam_v}) {
    for (const auto& [name, shape] : tensors_) {
      buffer.resize(static_cast<size_t>(stored_numel(name)));
      read(name, kind, 0, static_cast<int64_t>(buffer.size()), buffer.data());
      hasher.update(buffer.data(), buffer.size() * sizeof(float));
    }
  }
  return hasher.hex_digest();
}

std::string CheckpointReader::weights_digest() const {
  Sha256 hasher;
  std::vector<float> buffer;
  for (const auto& [name, shape] : tensors_) {
    buffer.resize(static_cast<size_t>(stored_numel(name)));
    read(name, StateKind::master, 0, static_cast<int64_t>(buffer.size()), buffer.data());
    hasher.update(buffer.data(), buffer.size() * sizeof(float));
  }
  return hasher.hex_digest();
}

}  // namespace shardlm
