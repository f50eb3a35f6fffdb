#include "shardlm/train/metrics.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"

namespace shardlm {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  SHARDLM_CHECK(file_ != nullptr, "cannot open metrics file '{}': {}", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

nlohmann::json phase_ms_json(const PhaseTotals& phases, double step_seconds,
                             double exposed_comm_seconds) {
  nlohmann::json out = nlohmann::json::object();
  for (int p = 0; p < kNumPhases; ++p)
    out[std::string(phase_name(static_cast<Phase>(p)))] = phases.seconds[p] * 1e3;
  out["communication"] = exposed_comm_seconds * 1e3;
  out["other"] = (step_seconds - phases.total_seconds() - exposed_comm_seconds) * 1e3;
  return out;
}

int truncate_metrics_after(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return 0;
  const std::string text = read_text_file(path);
  std::string kept;
  bool dropped = false;
  int unreadable = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    const bool complete = end != std::string::npos;
    if (!complete) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = complete && record.is_object() && record.contains("step") &&
                      record.at("step").is_number_integer() &&
                      record.at("step").get<int64_t>() <= step;
    if (keep)
      kept += line + "\n";
    else
      dropped = dropped || !line.empty();
    if (!line.empty() && (!complete || !record.is_object())) ++unreadable;
  }
  if (dropped) write_file_atomic(path, kept);
  return unreadable;
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (file_ == nullptr) return;
  std::string line = record.dump() + "\n";
  SHARDLM_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() &&
                    std::fflush(file_) == 0,
                "cannot write metrics file '{}': {}", path_, std::strerror(errno));
}

}  // namespace shardlm
