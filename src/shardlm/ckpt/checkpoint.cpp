#include "shardlm/ckpt/checkpoint.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "shardlm/core/error.hpp"
#include "shardlm/core/fault_injection.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/sha256.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

constexpr const char* kFormatName = "shardlm-checkpoint";
constexpr int kNumStates = 3;  // master, adam_m, adam_v

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

nlohmann::json layout_to_json(const ParamLayout& layout) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& unit : layout.units) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : unit.params)
      params.push_back({{"name", p.name}, {"offset", p.offset}, {"shape", p.shape}});
    units.push_back({{"name", unit.name},
                     {"numel", unit.numel},
                     {"padded_numel", unit.padded_numel},
                     {"params", params}});
  }
  return units;
}

void prune_old_checkpoints(const fs::path& root, int keep, const std::string& latest_name) {
  if (keep <= 0) return;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) {
    auto name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  int excess = static_cast<int>(names.size()) - keep;
  for (int i = 0; i < excess; ++i)
    if (names[static_cast<size_t>(i)] != latest_name) fs::remove_all(root / names[static_cast<size_t>(i)]);
}

}  // namespace

namespace {

// Runs `action` on this rank, then agrees with every rank on whether all succeeded:
// a failure anywhere becomes an Error everywhere (the failing rank's own message
// where it failed), so no rank waits for a peer that gave up.
template <typename Action>
void on_all_ranks(Communicator& comm, const std::string& what, Action&& action) {
  std::string error;
  try {
    action();
  } catch (const std::exception& e) {
    error = e.what();
  }
  int64_t failed = error.empty() ? 0 : 1;
  comm.all_reduce_blocking(std::span<int64_t>(&failed, 1), ReduceOp::sum, what);
  if (!error.empty()) throw Error(error);
  SHARDLM_CHECK(failed == 0, "{} failed on {} other rank(s) (see their messages)", what, failed);
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const ParamLayout& layout,
                            Strategy& strategy, const CheckpointInfo& info, int keep,
                            Communicator& comm) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = step_dir_name(info.step);
  const fs::path tmp = root / (".tmp-" + name);
  const fs::path final_dir = root / name;
  const std::string file_name = shard_file_name(comm.rank());
  std::error_code ec;
  bool renamed = false;
  try {
    on_all_ranks(comm, "checkpoint: create directory", [&] {
      if (comm.rank() != 0) return;
      fs::create_directories(root, ec);
      SHARDLM_CHECK(!ec, "cannot create checkpoint directory '{}': {}", root.string(), ec.message());
      fs::remove_all(tmp, ec);
      fs::create_directory(tmp, ec);
      SHARDLM_CHECK(!ec, "cannot create '{}': {}", tmp.string(), ec.message());
    });

    on_all_ranks(comm, "checkpoint: write shards", [&] {
      if (!strategy.writes_checkpoint()) return;
      // One file per writing rank: for each unit, its owned slice's master, adam_m,
      // adam_v; a small sidecar tells rank 0 what the file holds.
      nlohmann::json slices = nlohmann::json::array();
      Sha256 hasher;
      int64_t offset = 0;
      File file = File::create_write((tmp / file_name).string());
      for (int u = 0; u < layout.num_units(); ++u) {
        OwnedSlice s = strategy.owned(u);
        const size_t bytes = static_cast<size_t>(s.size()) * sizeof(float);
        for (const float* state : {s.master, s.adam_m, s.adam_v}) {
          file.write_all(state, bytes);
          hasher.update(state, bytes);
        }
        slices.push_back({{"unit", u}, {"begin", s.begin}, {"end", s.end}, {"offset", offset}});
        offset += static_cast<int64_t>(bytes) * kNumStates;
      }
      file.sync();
      file.close();
      nlohmann::json shard = {{"file", file_name},
                              {"rank", comm.rank()},
                              {"bytes", offset},
                              {"sha256", hasher.hex_digest()},
                              {"slices", slices}};
      write_file_atomic((tmp / (file_name + ".json")).string(), shard.dump());
      fault_point("ckpt_after_shard_files");
    });

    on_all_ranks(comm, "checkpoint: commit", [&] {
      if (comm.rank() != 0) return;
      nlohmann::json shards = nlohmann::json::array();
      for (int r = 0; r < comm.size(); ++r) {
        const fs::path sidecar = tmp / (shard_file_name(r) + ".json");
        if (!fs::exists(sidecar)) continue;
        shards.push_back(nlohmann::json::parse(read_text_file(sidecar.string())));
        fs::remove(sidecar);
      }
      nlohmann::json manifest = {{"format", kFormatName},
                                 {"format_version", kCheckpointFormatVersion},
                                 {"step", info.step},
                                 {"tokens_seen", info.tokens_seen},
                                 {"model", info.model.to_json()},
                                 {"tokenizer", info.tokenizer},
                                 {"strategy", info.strategy},
                                 {"world_size", info.world_size},
                                 {"train", info.train},
                                 {"units", layout_to_json(layout)},
                                 {"shards", shards}};
      File file = File::create_write((tmp / "manifest.json").string());
      std::string text = manifest.dump(1);
      file.write_all(text.data(), text.size());
      file.sync();
      file.close();
      fsync_directory(tmp.string());
      fault_point("ckpt_before_rename");
      if (fs::exists(final_dir)) fs::remove_all(final_dir);
      SHARDLM_CHECK(std::rename(tmp.c_str(), final_dir.c_str()) == 0,
                    "cannot rename '{}' to '{}': {}", tmp.string(), final_dir.string(),
                    std::strerror(errno));
      renamed = true;
      fsync_directory(root.string());
      fault_point("ckpt_before_latest");
      write_file_atomic((root / "latest").string(), name + "\n");
    });
  } catch (...) {
    // The previous checkpoint and `latest` are untouched; drop what this save made.
    if (comm.rank() == 0) {
      fs::remove_all(tmp, ec);
      if (renamed) fs::remove_all(final_dir, ec);
    }
    throw;
  }
  if (comm.rank() == 0) prune_old_checkpoints(root, keep, name);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const fs::path pointer = fs::path(run_dir) / "checkpoints" / "latest";
  if (!fs::exists(pointer)) return std::nullopt;
  std::string name = read_text_file(pointer.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  SHARDLM_CHECK(!name.empty() && name.find('/') == std::string::npos,
                "checkpoint pointer '{}' is corrupt (expected a directory name like step_00000100)",
                pointer.string());
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> names;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    auto name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) names.push_back(name);
  }
  std::sort(names.rbegin(), names.rend());
  std::vector<std::string> paths;
  for (const auto& n : names) paths.push_back((root / n).string());
  return paths;
}

std::unique_ptr<CheckpointReader> open_newest_valid_checkpoint(
    const std::string& run_dir, const std::function<void(const std::string&)>& warn) {
  // `latest` is the commit record: a newer directory it does not name was never
  // committed (a crash between rename and pointer update) and is not trusted.
  std::optional<std::string> latest;
  try {
    latest = latest_checkpoint(run_dir);
  } catch (const Error& e) {
    warn(e.what());
  }
  std::vector<std::string> candidates;
  if (latest) candidates.push_back(*latest);
  const std::string latest_name = latest ? fs::path(*latest).filename().string() : "";
  for (const auto& path : list_checkpoints(run_dir)) {
    const std::string name = fs::path(path).filename().string();
    if (latest && name > latest_name) {
      warn(fmt::format("ignoring checkpoint '{}': newer than checkpoints/latest, never committed",
                       path));
    } else if (!latest || name != latest_name) {
      candidates.push_back(path);
    }
  }
  if (candidates.empty()) return nullptr;
  for (const auto& path : candidates) {
    try {
      SHARDLM_CHECK(fs::exists(path), "checkpoint '{}' named by checkpoints/latest is missing", path);
      return std::make_unique<CheckpointReader>(path);
    } catch (const Error& e) {
      warn(fmt::format("skipping checkpoint '{}': {}", path, e.what()));
    }
  }
  throw Error(fmt::format("run directory '{}' has checkpoints but none is valid (see the warnings "
                          "above)",
                          run_dir));
}

std::string resolve_checkpoint_path(const std::string& path) {
  SHARDLM_CHECK(fs::exists(path), "checkpoint path '{}' does not exist", path);
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  auto latest = latest_checkpoint(path);
  SHARDLM_CHECK(latest.has_value(),
                "'{}' is neither a checkpoint (no manifest.json) nor a run directory with "
                "checkpoints/latest",
                path);
  return *latest;
}

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_text_file(manifest_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("checkpoint manifest '{}' is not valid JSON: {}", manifest_path,
                            e.what()));
  }
  try {
    SHARDLM_CHECK(m.value("format", "") == kFormatName,
                  "'{}' is not a shardlm checkpoint manifest (format field '{}', expected '{}')",
                  manifest_path, m.value("format", ""), kFormatName);
    int version = m.at("format_version").get<int>();
    SHARDLM_CHECK(version <= kCheckpointFormatVersion,
                  "checkpoint '{}' has format version {}, newer than this shardlm supports ({})",
                  manifest_path, version, kCheckpointFormatVersion);
    info_.step = m.at("step").get<int64_t>();
    info_.tokens_seen = m.at("tokens_seen").get<int64_t>();
    info_.model = ModelConfig::from_json(m.at("model"));
    info_.tokenizer = m.at("tokenizer").get<std::string>();
    info_.strategy = m.at("strategy").get<std::string>();
    info_.world_size = m.at("world_size").get<int>();
    info_.train = m.at("train");
    const auto& units = m.at("units");
    for (size_t u = 0; u < units.size(); ++u) {
      for (const auto& p : units[u].at("params")) {
        auto shape = p.at("shape").get<std::vector<int64_t>>();
        int64_t numel = 1;
        for (auto d : shape) numel *= d;
        tensors_.emplace_back(p.at("name").get<std::string>(), shape);
        locations_.emplace_back(p.at("name").get<std::string>(),
                                TensorLocation{static_cast<int>(u), p.at("offset").get<int64_t>(),
                                               numel});
      }
    }
    for (const auto& s : m.at("shards")) {
      Shard shard;
      shard.path = (fs::path(dir) / s.at("file").get<std::string>()).string();
      const auto expected_bytes = s.at("bytes").get<int64_t>();
      SHARDLM_CHECK(fs::exists(shard.path), "checkpoint shard '{}' is missing", shard.path);
      const auto actual_bytes = static_cast<int64_t>(fs::file_size(shard.path));
      SHARDLM_CHECK(actual_bytes == expected_bytes,
                    "checkpoint shard '{}' has {} bytes, the manifest expects {} (truncated or "
                    "corrupt)",
                    shard.path, actual_bytes, expected_bytes);
      const auto expected_sha = s.at("sha256").get<std::string>();
      SHARDLM_CHECK(sha256_file_hex(shard.path) == expected_sha,
                    "checkpoint shard '{}' fails its sha256 check (corrupt)", shard.path);
      for (const auto& sl : s.at("slices"))
        shard.slices.push_back({sl.at("unit").get<int>(), sl.at("begin").get<int64_t>(),
                                sl.at("end").get<int64_t>(), sl.at("offset").get<int64_t>()});
      shards_.push_back(std::move(shard));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("checkpoint manifest '{}' is missing a field: {}", manifest_path,
                            e.what()));
  }
}

const CheckpointReader::TensorLocation& CheckpointReader::locate(const std::string& name) const {
  for (const auto& [n, loc] : locations_)
    if (n == name) return loc;
  throw Error(fmt::format("checkpoint '{}' has no tensor named '{}'", dir_, name));
}

void CheckpointReader::read_unit_range(int unit, StateKind kind, int64_t begin, int64_t count,
                                       float* out) const {
  const int64_t end = begin + count;
  int64_t covered = 0;
  for (const auto& shard : shards_) {
    std::optional<File> file;
    for (const auto& sl : shard.slices) {
      if (sl.unit != unit) continue;
      const int64_t lo = std::max(begin, sl.begin);
      const int64_t hi = std::min(end, sl.end);
      if (lo >= hi) continue;
      if (!file) file = File::open_read(shard.path);
      const int64_t slice_len = sl.end - sl.begin;
      const int64_t element = static_cast<int64_t>(kind) * slice_len + (lo - sl.begin);
      file->read_at(out + (lo - begin), static_cast<size_t>(hi - lo) * sizeof(float),
                    sl.file_offset + element * static_cast<int64_t>(sizeof(float)));
      covered += hi - lo;
    }
  }
  SHARDLM_CHECK(covered == count,
                "checkpoint '{}' does not cover elements [{}, {}) of unit {} (shards missing?)",
                dir_, begin, end, unit);
}

void CheckpointReader::read(const std::string& name, StateKind kind, int64_t begin, int64_t count,
                            float* out) const {
  const auto& loc = locate(name);
  SHARDLM_ASSERT(begin >= 0 && begin + count <= loc.numel);
  read_unit_range(loc.unit, kind, loc.offset + begin, count, out);
}

void CheckpointReader::load_into(const ParamLayout& layout, Strategy& strategy) const {
  for (const auto* p : layout.all_params()) {
    bool found = false;
    for (const auto& [name, shape] : tensors_) {
      if (name != p->name) continue;
      found = true;
      SHARDLM_CHECK(shape == p->shape,
                    "checkpoint '{}' tensor '{}' has shape [{}], the model expects [{}]", dir_,
                    name, fmt::join(shape, ", "), fmt::join(p->shape, ", "));
    }
    SHARDLM_CHECK(found, "checkpoint '{}' has no tensor '{}' that the model needs", dir_, p->name);
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice s = strategy.owned(u);
    float* states[kNumStates] = {s.master, s.adam_m, s.adam_v};
    for (auto* state : states) std::memset(state, 0, static_cast<size_t>(s.size()) * sizeof(float));
    for (const auto& p : layout.units[static_cast<size_t>(u)].params) {
      const int64_t lo = std::max(s.begin, p.offset);
      const int64_t hi = std::min(s.end, p.offset + p.numel);
      if (lo >= hi) continue;
      for (int k = 0; k < kNumStates; ++k)
        read(p.name, static_cast<StateKind>(k), lo - p.offset, hi - lo, states[k] + (lo - s.begin));
    }
  }
  strategy.after_load();
}

std::string CheckpointReader::optimizer_digest() const {
  Sha256 hasher;
  std::vector<float> buffer;
  for (StateKind kind : {StateKind::adam_m, StateKind::adam_v}) {
    for (const auto& [name, shape] : tensors_) {
      const auto& loc = locate(name);
      buffer.resize(static_cast<size_t>(loc.numel));
      read(name, kind, 0, loc.numel, buffer.data());
      hasher.update(buffer.data(), buffer.size() * sizeof(float));
    }
  }
  return hasher.hex_digest();
}

std::string CheckpointReader::weights_digest() const {
  Sha256 hasher;
  std::vector<float> buffer;
  for (const auto& [name, shape] : tensors_) {
    const auto& loc = locate(name);
    buffer.resize(static_cast<size_t>(loc.numel));
    read(name, StateKind::master, 0, loc.numel, buffer.data());
    hasher.update(buffer.data(), buffer.size() * sizeof(float));
  }
  return hasher.hex_digest();
}

}  // namespace shardlm
