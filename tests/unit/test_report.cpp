// HTML reports: well-formed (every tag closed, in order), self-contained (no script,
// nothing fetched), every numeric series of metrics.jsonl drawn, text escaped; chart
// axes cover the data; bench tables compute measured / predicted ratios.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "shardlm/core/error.hpp"
#include "shardlm/report/bench_result.hpp"
#include "shardlm/report/html_report.hpp"
#include "shardlm/report/svg_chart.hpp"

using namespace shardlm;
using namespace shardlm::report;
namespace fs = std::filesystem;

namespace {

// Every element opened is closed in order (self-closing ones count as both).
// Returns "" or what is wrong.
std::string tag_problem(const std::string& html) {
  std::vector<std::string> open;
  size_t i = 0;
  while ((i = html.find('<', i)) != std::string::npos) {
    const size_t end = html.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    const std::string tag = html.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty() || tag[0] == '!') continue;  // <!DOCTYPE html>
    if (tag.back() == '/') continue;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? "nothing" : "<" + open.back() + ">");
      open.pop_back();
      continue;
    }
    open.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

// The paths of every numeric field of the records, found independently of the report.
std::set<std::string> numeric_paths(const std::vector<nlohmann::json>& records) {
  std::set<std::string> out;
  std::function<void(const nlohmann::json&, const std::string&)> walk =
      [&](const nlohmann::json& j, const std::string& path) {
        if (j.is_object())
          for (auto it = j.begin(); it != j.end(); ++it)
            walk(it.value(), path.empty() ? it.key() : path + "." + it.key());
        else if (j.is_number() && path != "step")
          out.insert(path);
      };
  for (const auto& r : records) walk(r, "");
  return out;
}

std::vector<nlohmann::json> sample_records() {
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 3; ++step) {
    nlohmann::json r = {
        {"step", step},
        {"loss", 5.0 - step},
        {"tokens_per_s", 100.0 * step},
        {"step_ms", 1000.0 / step},
        {"strategy", "zero3 <&>"},
        {"comm_ms", 12.5},
        {"exposed_comm_ms", 2.5},
        {"comm", {{"all_gather", {{"calls", 3}, {"bus_bytes", 4096}}}, {"exposed_seconds", 0.0025}}},
        {"mem", {{"peak", {{"params", 1 << 20}, {"activations", 3 << 20}}}, {"peak_total", 4 << 20}}},
        {"phase_ms", {{"gemm", 600.0 / step}, {"communication", 2.5}, {"other", 10.0}}}};
    if (step == 3) r["val_loss"] = 2.25;
    records.push_back(r);
  }
  return records;
}

std::string write_run(const std::vector<nlohmann::json>& records) {
  const fs::path dir = fs::path(testing::TempDir()) / "shardlm_report_run";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream out(dir / "metrics.jsonl");
  for (const auto& r : records) out << r.dump() << "\n";
  std::ofstream(dir / "config.json") << nlohmann::json{{"strategy", "zero3"}, {"world_size", 2}}.dump();
  return dir.string();
}

}  // namespace

TEST(Report, RunPageIsWellFormedSelfContainedAndDrawsEverySeries) {
  const auto records = sample_records();
  const RunMetrics run = load_run(write_run(records));
  const std::string html = run_report_html(run);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(tag_problem(html), "");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://www.w3.org/2000/svg"), html.find("http"));  // the namespace only
  const auto paths = numeric_paths(records);
  EXPECT_GE(paths.size(), 14u);
  for (const auto& path : paths)
    EXPECT_NE(html.find("<title>" + path + "</title>"), std::string::npos) << path;
  // Text from the run is escaped, never markup.
  EXPECT_EQ(html.find("zero3 <&>"), std::string::npos);
}

TEST(Report, SteadyStateIsTheMedianAfterTheFirstStep) {
  const RunMetrics run = load_run(write_run(sample_records()));
  const SteadyState s = steady_state(run);
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.step_ms, (500.0 + 1000.0 / 3) / 2);
  EXPECT_DOUBLE_EQ(s.tokens_per_s, 250.0);
  EXPECT_DOUBLE_EQ(s.phase_ms.at("gemm"), (300.0 + 200.0) / 2);
  EXPECT_DOUBLE_EQ(s.peak_bytes.at("activations"), 3 << 20);
}

TEST(Report, MissingOrBrokenMetricsAreNamed) {
  const fs::path dir = fs::path(testing::TempDir()) / "shardlm_report_broken";
  fs::remove_all(dir);
  fs::create_directories(dir);
  try {
    load_run(dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no metrics.jsonl"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1}\n{oops\n";
  try {
    load_run(dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2 is not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(Report, BenchTableAndPageCarryMeasuredOverPredicted) {
  BenchResult b;
  b.setup = {{"model", "gpt2-small-30m"}, {"ranks", 2}};
  for (const char* label : {"ddp", "zero3"}) {
    BenchRow row;
    row.label = label;
    row.flags = std::string("--strategy ") + label;
    row.run_dir = "runs/x";
    row.measured.step_ms = 1250;
    row.measured.tokens_per_s = 800;
    row.predicted = {true, 1000, 1000, 900, 200, 100, 0};
    row.planned_bytes = {{"params", 1 << 20}};
    b.rows.push_back(row);
  }
  const std::string table = bench_table(b);
  EXPECT_NE(table.find("| ddp | 800 | 1000 | 0.80 | 1250 | 1000 | 1.25 |"), std::string::npos) << table;
  const BenchResult again = BenchResult::from_json(b.to_json());
  EXPECT_EQ(again.to_json(), b.to_json());
  const std::string html = bench_report_html(b, {});
  EXPECT_EQ(tag_problem(html), "");
  EXPECT_NE(html.find("<td>1.25</td>"), std::string::npos);
}

TEST(Report, AxisTicksAreRoundAndCoverTheData) {
  const auto t = nice_ticks(0, 535, 5);
  EXPECT_EQ(t.front(), 0);
  EXPECT_GE(t.back(), 535);
  EXPECT_EQ(t, (std::vector<double>{0, 200, 400, 600}));
  const auto u = nice_ticks(9.63, 10.97, 5);
  EXPECT_LE(u.front(), 9.63);
  EXPECT_GE(u.back(), 10.97);
  EXPECT_DOUBLE_EQ(u[1] - u[0], 0.5);
}

TEST(Report, AxisTicksOfValuesARoundingApartEnd) {
  // Two readings one ulp apart: a step finer than half an ulp never advanced the ticks
  // (the loop pushed until bad_alloc). The range is drawn as flat instead.
  for (const double v : {0.3, 1e6, 1e20, -7.5e-9}) {
    const auto t = nice_ticks(v, std::nextafter(v, INFINITY), 5);
    ASSERT_GE(t.size(), 2u) << v;
    ASSERT_LE(t.size(), 8u) << v;
    EXPECT_LE(t.front(), v);
    EXPECT_GT(t.back(), v);
    for (size_t i = 1; i < t.size(); ++i) EXPECT_GT(t[i], t[i - 1]) << v;
  }
  LineChart c;
  c.title = "seconds";
  Series s;
  s.name = "seconds";
  s.x = {1, 2};
  s.y = {0.3, std::nextafter(0.3, 1.0)};
  c.series.push_back(s);
  EXPECT_NE(line_chart_svg(c).find("</svg>"), std::string::npos);
}
