// Self-contained HTML reports (inline SVG, inline CSS, no script, nothing fetched):
// one training run, or a bench of several runs with plan's predictions beside them.
#pragma once

#include <string>
#include <vector>

#include "shardlm/report/bench_result.hpp"
#include "shardlm/report/run_metrics.hpp"

namespace shardlm::report {

// Loss and validation loss, tokens/s, step time split by phase with the exposed
// communication, communication time, memory by category per rank, and a small chart
// of every numeric series in metrics.jsonl.
std::string run_report_html(const RunMetrics& run);

// The predicted-vs-measured table, step time (measured phases vs predicted compute,
// exposed communication and overlap cost), tokens/s, memory by category per rank and
// run (measured vs planned), the runs' loss curves together, and each run's report.
std::string bench_report_html(const BenchResult& bench, const std::vector<RunMetrics>& runs);

}  // namespace shardlm::report
