#include "shardlm/report/run_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>

#include "shardlm/core/error.hpp"

namespace fs = std::filesystem;

namespace shardlm::report {

namespace {

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  SHARDLM_CHECK(in.good(), "cannot read '{}'", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("'{}' is not valid JSON: {}", path.string(), e.what()));
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void flatten(const nlohmann::json& j, const std::string& prefix, double step,
             std::map<std::string, NumericSeries>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), step, out);
  } else if (j.is_number() && !prefix.empty()) {
    auto& s = out[prefix];
    s.step.push_back(step);
    s.value.push_back(j.get<double>());
  }
}

}  // namespace

RunMetrics load_run(const std::string& dir) {
  RunMetrics run;
  run.dir = dir;
  const fs::path metrics = fs::path(dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  SHARDLM_CHECK(in.good(), "'{}' has no metrics.jsonl (expected a run directory written by "
                "`shardlm train --out`)", dir);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      run.records.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      // The last line of a job killed while writing it is cut: the report is of the
      // records before it (and says so). A bad line anywhere else is damage.
      const bool cut_last_line = in.eof();
      if (cut_last_line) {
        std::fprintf(stderr, "warning: '%s' line %d is cut (the job ended while writing it): left out\n",
                     metrics.string().c_str(), number);
        break;
      }
      throw Error(fmt::format("'{}' line {} is not valid JSON: {}", metrics.string(), number, e.what()));
    }
  }
  SHARDLM_CHECK(!run.records.empty(), "'{}' holds no step records", metrics.string());
  if (fs::exists(fs::path(dir) / "config.json")) run.config = read_json_file(fs::path(dir) / "config.json");
  if (fs::exists(fs::path(dir) / "memory_by_rank.json"))
    run.memory_by_rank = read_json_file(fs::path(dir) / "memory_by_rank.json");
  return run;
}

std::map<std::string, NumericSeries> numeric_series(const RunMetrics& run) {
  std::map<std::string, NumericSeries> out;
  for (const auto& r : run.records) {
    const double step = r.value("step", 0.0);
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key() != "step") flatten(it.value(), it.key(), step, out);
  }
  return out;
}

SteadyState steady_state(const RunMetrics& run) {
  SteadyState s;
  const size_t first = run.records.size() > 1 ? 1 : 0;
  std::map<std::string, std::vector<double>> values;
  for (size_t i = first; i < run.records.size(); ++i) {
    const auto& r = run.records[i];
    for (const char* key : {"step_ms", "tokens_per_s", "comm_ms", "exposed_comm_ms", "comm_bytes"})
      if (r.contains(key) && r.at(key).is_number()) values[key].push_back(r.at(key).get<double>());
    if (r.contains("phase_ms"))
      for (auto it = r.at("phase_ms").begin(); it != r.at("phase_ms").end(); ++it)
        values["phase_ms." + it.key()].push_back(it.value().get<double>());
  }
  s.steps = static_cast<int>(run.records.size() - first);
  s.step_ms = median(values["step_ms"]);
  s.tokens_per_s = median(values["tokens_per_s"]);
  s.comm_ms = median(values["comm_ms"]);
  s.exposed_comm_ms = median(values["exposed_comm_ms"]);
  s.comm_bytes = median(values["comm_bytes"]);
  for (const auto& [key, v] : values)
    if (key.rfind("phase_ms.", 0) == 0) s.phase_ms[key.substr(9)] = median(v);
  const auto& last = run.records.back();
  if (last.contains("mem") && last.at("mem").contains("peak"))
    for (auto it = last.at("mem").at("peak").begin(); it != last.at("mem").at("peak").end(); ++it)
      s.peak_bytes[it.key()] = it.value().get<double>();
  return s;
}

double counted_memory_bytes(const std::map<std::string, double>& by_category) {
  double sum = 0;
  for (const auto& c : kCountedMemoryCategories)
    if (const auto it = by_category.find(c); it != by_category.end()) sum += it->second;
  return sum;
}

}  // namespace shardlm::report
