// A training run's recorded metrics (RUN_DIR/metrics.jsonl, config.json, and the
// per-rank memory the trainer writes at the end), read back for reports and benches.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::report {

struct RunMetrics {
  std::string dir;
  nlohmann::json config;                // config.json (null when absent)
  std::vector<nlohmann::json> records;  // one per line of metrics.jsonl
  nlohmann::json memory_by_rank;        // memory_by_rank.json (null when absent)
};

// Error naming the file (and line) when the directory has no readable metrics.jsonl.
RunMetrics load_run(const std::string& dir);

struct NumericSeries {
  std::vector<double> step, value;
};
// Every numeric field of the records, by its path ("loss", "phase_ms.gemm",
// "comm.all_gather.bytes", "mem.peak.params"), against the record's step.
std::map<std::string, NumericSeries> numeric_series(const RunMetrics& run);

// The steady state of a run: medians over its steps after the first (which pays
// first touches and warm-up), and the last record's peak memory (rank 0).
struct SteadyState {
  int steps = 0;
  double step_ms = 0, tokens_per_s = 0, comm_ms = 0, exposed_comm_ms = 0, comm_bytes = 0;
  std::map<std::string, double> phase_ms;
  std::map<std::string, double> peak_bytes;  // by memory category
};
SteadyState steady_state(const RunMetrics& run);

// The memory categories that measured peaks and plans both count, in stacking order
// ("frozen": a LoRA/QLoRA base), and their sum in a by-category map.
inline const std::vector<std::string> kCountedMemoryCategories = {"params", "frozen", "grads", "optimizer",
                                                                  "activations", "comm"};
double counted_memory_bytes(const std::map<std::string, double>& by_category);

}  // namespace shardlm::report
