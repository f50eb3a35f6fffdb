// save_checkpoint: shards from every writing rank, then the commit on rank 0
// (docs/checkpoint-format.md, "Commit and recovery").
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/checkpoint_commit.hpp"
#include "shardlm/comm/on_all_ranks.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/fault_injection.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/parallel/owned_params.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

// The marker goes first, so a crash while deleting never leaves a directory that
// looks committed but lacks files.
void remove_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / kCommitMarkerName, ec);
  fs::remove_all(dir, ec);
}

// Keeps the newest `keep` committed checkpoints (all if keep <= 0) and the one just
// committed; removes never-committed directories older than it (a later save of
// their step would replace them anyway).
void prune_checkpoints(const fs::path& root, int keep, const std::string& committed_name) {
  std::vector<std::string> committed;
  for (const auto& path : list_checkpoints(root.parent_path().string())) {  // newest first
    const std::string name = fs::path(path).filename().string();
    if (name == committed_name) {
      committed.push_back(name);
    } else if (!has_commit_marker(path)) {
      if (name < committed_name) remove_checkpoint_dir(path);
    } else if (keep > 0 && static_cast<int>(committed.size()) >= keep) {
      remove_checkpoint_dir(path);
    } else {
      committed.push_back(name);
    }
  }
}

// Rank 0: the writing ranks' shard descriptions, each checked to be there.
nlohmann::json collect_shards(const fs::path& tmp, const std::vector<uint64_t>& writers) {
  nlohmann::json shards = nlohmann::json::array();
  for (int r = 0; r < static_cast<int>(writers.size()); ++r) {
    const fs::path shard = tmp / shard_file_name(r);
    const fs::path sidecar = tmp / (shard_file_name(r) + ".json");
    if (writers[static_cast<size_t>(r)] == 0) {
      SHARDLM_CHECK(!fs::exists(shard) && !fs::exists(sidecar),
                    "checkpoint: '{}' holds a shard of rank {}, which does not write checkpoints "
                    "(is another job writing to this run directory?)",
                    tmp.string(), r);
      continue;
    }
    SHARDLM_CHECK(fs::exists(shard), "checkpoint: rank {}'s shard '{}' is missing; not committing",
                  r, shard.string());
    SHARDLM_CHECK(fs::exists(sidecar),
                  "checkpoint: rank {}'s shard description '{}' is missing; not committing", r,
                  sidecar.string());
    try {
      shards.push_back(nlohmann::json::parse(read_text_file(sidecar.string())));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("checkpoint: '{}' is not valid JSON: {}", sidecar.string(), e.what()));
    }
    fs::remove(sidecar);
  }
  return shards;
}

void hash_zeros(Sha256& hasher, size_t bytes) {
  static const std::vector<std::byte> zeros(size_t{1} << 20);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(zeros.size(), bytes - done);
    hasher.update(zeros.data(), n);
    done += n;
  }
}

// This rank's owned slices into DIR/rank_R.bin, and a sidecar describing them.
void write_shard(const fs::path& tmp, const ParamLayout& layout, OwnedState& state, int rank) {
  // Tensor rank t's units follow the units of the tensor ranks before it in the manifest.
  const int first_unit = layout.tensor.rank * layout.num_units();
  const std::string file_name = shard_file_name(rank);
  nlohmann::json slices = nlohmann::json::array();
  Sha256 hasher;
  int64_t offset = 0;
  File file = File::create_write((tmp / file_name).string());
  for (int u = 0; u < layout.num_units(); ++u) {
    // An expert held elsewhere (expert parallelism) owns nothing here.
    if (!state.writes_unit(u)) continue;
    OwnedSlice s = state.owned(u);
    if (s.size() == 0) continue;
    const size_t bytes = static_cast<size_t>(s.size()) * sizeof(float);
    // The parameters as fp32 values (a frozen unit stored in the compute type widened
    // exactly: the checkpoint holds the values the run computes with).
    for_each_owned_params(s, [&](int64_t, int64_t n, const float* values) {
      const size_t piece = static_cast<size_t>(n) * sizeof(float);
      file.write_all(values, piece);
      hasher.update(values, piece);
    });
    for (const float* state : {s.adam_m, s.adam_v}) {
      if (state != nullptr) {
        file.write_all(state, bytes);
        hasher.update(state, bytes);
      } else {
        // A frozen unit has no optimizer state: zeros, stored as a hole in the file.
        file.write_zeros(bytes);
        hash_zeros(hasher, bytes);
      }
    }
    slices.push_back({{"unit", first_unit + u}, {"begin", s.begin}, {"end", s.end}, {"offset", offset}});
    offset += static_cast<int64_t>(bytes) * kCheckpointStates;
  }
  file.sync();
  file.close();
  nlohmann::json shard = {{"file", file_name},
                          {"rank", rank},
                          {"bytes", offset},
                          {"sha256", hasher.hex_digest()},
                          {"slices", slices}};
  write_file_atomic((tmp / (file_name + ".json")).string(), shard.dump());
}

}  // namespace

void remove_interrupted_saves(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step_", 0) == 0 || name.rfind("latest.tmp.", 0) == 0)
      fs::remove_all(entry.path(), ec);
  }
}

std::string save_checkpoint(const std::string& run_dir, const ParamLayout& layout,
                            OwnedState& state, const CheckpointInfo& info, int keep,
                            Communicator& comm) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = checkpoint_dir_name(info.step);
  const fs::path tmp = root / (".tmp-" + name);
  const fs::path final_dir = root / name;
  std::error_code ec;
  bool renamed = false;
  try {
    on_all_ranks(comm, "checkpoint: create directory", [&] {
      if (comm.rank() != 0) return;
      fs::create_directories(root, ec);
      SHARDLM_CHECK(!ec, "cannot create checkpoint directory '{}': {}", root.string(), ec.message());
      remove_interrupted_saves(run_dir);
      fs::create_directory(tmp, ec);
      SHARDLM_CHECK(!ec, "cannot create '{}': {}", tmp.string(), ec.message());
    });
    const std::vector<uint64_t> writers =
        comm.all_gather_u64(state.writes_checkpoint() ? 1 : 0, "checkpoint: writers");

    on_all_ranks(comm, "checkpoint: write shards", [&] {
      if (!state.writes_checkpoint()) return;
      write_shard(tmp, layout, state, comm.rank());
      fault_point("ckpt_after_shard_files");
    });

    on_all_ranks(comm, "checkpoint: commit", [&] {
      if (comm.rank() != 0) return;
      const nlohmann::json manifest =
          manifest_to_json(info, layout_to_manifest_units(layout, info.model), collect_shards(tmp, writers));
      const fs::path manifest_path = tmp / "manifest.json";
      // The checks every reader makes (coverage above all) before anything is committed.
      parse_checkpoint_manifest(manifest, manifest_path.string());
      const std::string text = manifest.dump(1);
      File file = File::create_write(manifest_path.string());
      file.write_all(text.data(), text.size());
      file.sync();
      file.close();
      fsync_directory(tmp.string());
      fault_point("ckpt_before_rename");
      if (fs::exists(final_dir)) remove_checkpoint_dir(final_dir);
      SHARDLM_CHECK(std::rename(tmp.c_str(), final_dir.c_str()) == 0,
                    "cannot rename '{}' to '{}': {}", tmp.string(), final_dir.string(),
                    std::strerror(errno));
      renamed = true;
      fsync_directory(root.string());
      fault_point("ckpt_before_commit_marker");
      write_commit_marker(final_dir.string(), {info.step, sha256_hex(text.data(), text.size())});
      fault_point("ckpt_before_latest");
      write_file_atomic((root / "latest").string(), name + "\n");
    });
  } catch (...) {
    // The previous checkpoints are untouched; drop what this save made.
    if (comm.rank() == 0) {
      fs::remove_all(tmp, ec);
      if (renamed) remove_checkpoint_dir(final_dir);
    }
    throw;
  }
  if (comm.rank() == 0) prune_checkpoints(root, keep, name);
  return final_dir.string();
}

}  // namespace shardlm
