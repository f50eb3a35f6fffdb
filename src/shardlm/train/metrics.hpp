// Run metrics: RUN_DIR/metrics.jsonl, one JSON object per line, flushed per line so
// a crashed run keeps what it measured.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/core/phase_profile.hpp"

namespace shardlm {

// A step's "phase_ms" record: milliseconds per profiled phase (exclusive times, see
// core/phase_profile.hpp), "communication" = the compute thread's exposed wait for
// collectives, and "other" = the step's wall time minus all of those (the trainer's
// own work: sampling, gradient zeroing, strategy hooks, unprofiled code).
nlohmann::json phase_ms_json(const PhaseTotals& phases, double step_seconds,
                             double exposed_comm_seconds);

// Keeps one record per step across restarts: rewrites PATH (atomically) without the
// records of steps after `step` (a run resumed from step `step` writes them again) and
// without lines that do not parse (a crash mid-line). Nothing happens when PATH does
// not exist or holds no such record. Returns how many unreadable lines it dropped (the
// caller says so: a cut line's record is lost).
int truncate_metrics_after(const std::string& path, int64_t step);

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
