#include "shardlm/train/metrics.hpp"

#include <cerrno>
#include <cstring>

#include "shardlm/core/error.hpp"

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

void MetricsWriter::write(const nlohmann::json& record) {
  if (file_ == nullptr) return;
  std::string line = record.dump() + "\n";
  SHARDLM_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() &&
                    std::fflush(file_) == 0,
                "cannot write metrics file '{}': {}", path_, std::strerror(errno));
}

}  // namespace shardlm
