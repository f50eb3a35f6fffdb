// What `shardlm bench` measured next to what `plan` predicted, per run: the data of
// its table, bench.json and the HTML report.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardlm/report/run_metrics.hpp"

namespace shardlm::report {

struct Prediction {
  bool available = false;  // false without a hardware profile
  double step_ms = 0, tokens_per_s = 0, compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0,
         overlap_cost_ms = 0;
};

struct BenchRow {
  std::string label;               // "zero3", "zero3 prefetch 2"
  std::string flags;               // the train flags of this run
  std::string run_dir;             // relative to the bench directory
  SteadyState measured;
  Prediction predicted;
  double planned_wire_bytes = 0;   // per rank and step
  std::map<std::string, double> planned_bytes;  // per rank by memory category
};

struct BenchResult {
  nlohmann::json setup;  // model, ranks, precision, steps, cluster, profile, machine load
  std::vector<BenchRow> rows;
  nlohmann::json to_json() const;
  static BenchResult from_json(const nlohmann::json& j);  // Error naming the field
};

// The table `bench` prints (markdown): measured next to predicted, with ratios.
std::string bench_table(const BenchResult& bench);

}  // namespace shardlm::report
