// Run metrics: RUN_DIR/metrics.jsonl, one JSON object per line, flushed per line so
// a crashed run keeps what it measured.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace shardlm {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path);  // appends
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace shardlm
