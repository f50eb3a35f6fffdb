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

void MetricsWriter::write(const nlohmann::json& record) {
  if (file_ == nullptr) return;
  std::string line = record.dump() + "\n";
  SHARDLM_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() &&
                    std::fflush(file_) == 0,
                "cannot write metrics file '{}': {}", path_, std::strerror(errno));
}

}  // namespace shardlm
