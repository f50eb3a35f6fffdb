#include "shardlm/ckpt/checkpoint_commit.hpp"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {
constexpr const char* kMarkerFormat = "shardlm-checkpoint-commit";
}

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

void write_commit_marker(const std::string& dir, const CommitMarker& marker) {
  const nlohmann::json j = {{"format", kMarkerFormat},
                            {"step", marker.step},
                            {"manifest_sha256", marker.manifest_sha256}};
  write_file_atomic((fs::path(dir) / kCommitMarkerName).string(), j.dump() + "\n");
}

bool has_commit_marker(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kCommitMarkerName, ec);
}

CommitMarker read_commit_marker(const std::string& dir) {
  const std::string path = (fs::path(dir) / kCommitMarkerName).string();
  SHARDLM_CHECK(has_commit_marker(dir),
                "checkpoint '{}' has no commit marker ({}): it was never committed (its save "
                "did not finish)",
                dir, kCommitMarkerName);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("commit marker '{}' is not valid JSON (damaged)", path));
  }
  const bool valid = j.is_object() && j.value("format", "") == kMarkerFormat &&
                     j.contains("step") && j.at("step").is_number_integer() &&
                     j.at("step").get<int64_t>() >= 0 && j.contains("manifest_sha256") &&
                     j.at("manifest_sha256").is_string() &&
                     j.at("manifest_sha256").get<std::string>().size() == 64;
  SHARDLM_CHECK(valid,
                "commit marker '{}' is damaged (expected format, step and a 64-digit "
                "manifest_sha256)",
                path);
  return {j.at("step").get<int64_t>(), j.at("manifest_sha256").get<std::string>()};
}

}  // namespace shardlm
