// The recovery rule: which checkpoint of a run directory a resume (or a command given
// a run directory) loads. docs/checkpoint-format.md, "Commit and recovery".
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/checkpoint_commit.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

// What checkpoints/latest names, or "" when it is absent or unreadable. Only used to
// tell the user when it disagrees with the checkpoint chosen.
std::string latest_hint(const std::string& run_dir) {
  const fs::path pointer = fs::path(run_dir) / "checkpoints" / "latest";
  std::error_code ec;
  if (!fs::exists(pointer, ec)) return "";
  try {
    std::string name = read_text_file(pointer.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return name;
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

void print_checkpoint_warning(const std::string& line) {
  std::fflush(stdout);
  std::fprintf(stderr, "warning: %s\n", line.c_str());
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> names;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    auto name = entry.path().filename().string();
    if (entry.is_directory(ec) && name.rfind("step_", 0) == 0) names.push_back(name);
  }
  std::sort(names.rbegin(), names.rend());
  std::vector<std::string> paths;
  for (const auto& n : names) paths.push_back((root / n).string());
  return paths;
}

std::unique_ptr<CheckpointReader> open_newest_valid_checkpoint(const std::string& run_dir,
                                                               const CheckpointWarning& warn) {
  int committed = 0;
  for (const auto& path : list_checkpoints(run_dir)) {
    if (!has_commit_marker(path)) {
      warn(fmt::format("ignoring '{}': never committed (no {}; its save did not finish)", path,
                       kCommitMarkerName));
      continue;
    }
    ++committed;
    try {
      auto reader = std::make_unique<CheckpointReader>(path);
      const std::string name = fs::path(path).filename().string();
      SHARDLM_CHECK(name == checkpoint_dir_name(reader->info().step),
                    "its manifest is for step {}, not the step its name says",
                    reader->info().step);
      const std::string hint = latest_hint(run_dir);
      if (hint != name)
        warn(fmt::format("{}; loading the newest valid committed checkpoint '{}' (latest is "
                         "only a hint)",
                         hint.empty() ? "checkpoints/latest is missing or unreadable"
                                      : fmt::format("checkpoints/latest names '{}'", hint),
                         name));
      return reader;
    } catch (const Error& e) {
      warn(fmt::format("skipping checkpoint '{}': {}", path, e.what()));
    }
  }
  SHARDLM_CHECK(committed == 0,
                "run directory '{}' has {} committed checkpoint(s) but none is valid (see the "
                "warnings above)",
                run_dir, committed);
  return nullptr;
}

std::unique_ptr<CheckpointReader> open_checkpoint(const std::string& path,
                                                  const CheckpointWarning& warn) {
  SHARDLM_CHECK(fs::exists(path), "checkpoint path '{}' does not exist", path);
  if (fs::exists(fs::path(path) / "manifest.json")) return std::make_unique<CheckpointReader>(path);
  auto reader = open_newest_valid_checkpoint(path, warn);
  SHARDLM_CHECK(reader != nullptr,
                "'{}' is neither a checkpoint (no manifest.json) nor a run directory with a "
                "committed checkpoint",
                path);
  return reader;
}

}  // namespace shardlm
