#include "shardlm/report/html_report.hpp"

#include <cmath>
#include <fmt/format.h>

#include "shardlm/report/svg_chart.hpp"

namespace shardlm::report {

namespace {

const char* kStyle = R"(<style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
table.kv td{text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:8px}.note{color:#555;font-size:12px}
details{margin:10px 0}summary{cursor:pointer;font-weight:bold}
</style>)";

// Phases of a step as metrics.jsonl's phase_ms names them, in stacking order.
const std::vector<std::string> kPhases = {"gemm", "attention", "norms_elementwise", "loss",
                                          "optimizer", "communication", "other"};
const std::vector<std::string> kPhaseColors = {"#0072B2", "#56B4E9", "#009E73", "#F0E442",
                                               "#CC79A7", "#D55E00", "#BBBBBB"};
const std::vector<std::string> kMemory = [] {
  std::vector<std::string> categories = kCountedMemoryCategories;
  categories.push_back("other");
  return categories;
}();

std::string page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>" +
         escape_html(title) + "</title>" + kStyle + "</head><body><h1>" + escape_html(title) +
         "</h1>\n" + body + "</body></html>\n";
}

// css_class "kv": a key/value table (text, left-aligned) rather than columns of numbers.
std::string table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows,
                  const std::string& css_class = "") {
  std::string s = css_class.empty() ? "<table><tr>" : "<table class=\"" + css_class + "\"><tr>";
  for (const auto& h : header) s += "<th>" + escape_html(h) + "</th>";
  s += "</tr>";
  for (const auto& r : rows) {
    s += "<tr>";
    for (const auto& c : r) s += "<td>" + escape_html(c) + "</td>";
    s += "</tr>";
  }
  return s + "</table>\n";
}

// "beta1=0.9, lr=0.001, ..." of a JSON object (floats as stored in fp32 read back
// without their noise: init_std=0.02, not 0.019999999552965164).
std::string key_values(const nlohmann::json& object) {
  if (!object.is_object()) return object.dump();
  std::string s;
  for (auto it = object.begin(); it != object.end(); ++it)
    s += (s.empty() ? "" : ", ") + it.key() + "=" +
         (it.value().is_number_float() ? fmt::format("{:.6g}", it.value().get<double>())
          : it.value().is_string()     ? it.value().get<std::string>()
                                       : it.value().dump());
  return s;
}

std::string label_of(const RunMetrics& run) {
  if (run.config.is_object())
    return fmt::format("{} x {}", run.config.value("strategy", std::string("?")),
                       run.config.value("world_size", 1));
  return run.dir;
}

const NumericSeries* find(const std::map<std::string, NumericSeries>& s, const std::string& key) {
  const auto it = s.find(key);
  return it == s.end() ? nullptr : &it->second;
}

Series series_of(const std::map<std::string, NumericSeries>& all, const std::string& key,
                 const std::string& name, bool points = false) {
  Series s;
  s.name = name;
  s.points_only = points;
  if (const NumericSeries* n = find(all, key)) s.x = n->step, s.y = n->value;
  return s;
}

double mib(double bytes) { return bytes / (1 << 20); }

// Memory by category (MiB) per rank: memory_by_rank.json when the run wrote it, else
// rank 0's peaks from the last record.
void memory_bars(const RunMetrics& run, const std::string& prefix, StackedBars& chart) {
  const auto add = [&](const std::string& bar, const nlohmann::json& peak) {
    chart.bars.push_back(bar);
    for (size_t k = 0; k < kMemory.size(); ++k)
      chart.values[k].push_back(mib(peak.value(kMemory[k], 0.0)));
  };
  if (run.memory_by_rank.is_object() && run.memory_by_rank.contains("ranks")) {
    const auto& ranks = run.memory_by_rank.at("ranks");
    for (size_t r = 0; r < ranks.size(); ++r)
      add(fmt::format("{}rank {}", prefix, r), ranks[r].at("peak"));
  } else if (run.records.back().contains("mem")) {
    add(prefix + "rank 0", run.records.back().at("mem").at("peak"));
  }
}

StackedBars memory_chart(const std::string& title) {
  StackedBars c;
  c.title = title;
  c.y_label = "MiB (peak per category)";
  c.categories = kMemory;
  c.values.assign(kMemory.size(), {});
  return c;
}

std::string run_sections(const RunMetrics& run, const std::string& heading_prefix) {
  const auto all = numeric_series(run);
  std::string s;
  // Summary.
  std::vector<std::vector<std::string>> rows;
  if (run.config.is_object()) {
    const auto& c = run.config;
    rows.push_back({"model", c.contains("model") ? key_values(c.at("model")) : "?"});
    rows.push_back({"strategy x ranks", label_of(run)});
    rows.push_back({"threads per rank", std::to_string(c.value("threads", 0))});
    if (c.contains("options") && c.at("options").is_object())
      rows.push_back({"options", key_values(c.at("options"))});
    if (c.contains("strategy_auto")) rows.push_back({"--strategy auto", c.value("strategy_auto", "")});
  }
  const SteadyState steady = steady_state(run);
  rows.push_back({"steps recorded", std::to_string(run.records.size())});
  rows.push_back({"final loss", fmt::format("{:.4f}", run.records.back().value("loss", NAN))});
  rows.push_back({"median step (after the first)", fmt::format("{:.0f} ms, {:.0f} tokens/s",
                                                               steady.step_ms, steady.tokens_per_s)});
  rows.push_back({"median exposed communication", fmt::format("{:.1f} ms of {:.1f} ms communicating",
                                                              steady.exposed_comm_ms, steady.comm_ms)});
  s += table({heading_prefix + "run", run.dir}, rows, "kv");

  LineChart loss;
  loss.title = "Loss";
  loss.x_label = "step";
  loss.series = {series_of(all, "loss", "train loss"), series_of(all, "val_loss", "val loss", true)};
  LineChart speed;
  speed.title = "Tokens/s";
  speed.x_label = "step";
  speed.series = {series_of(all, "tokens_per_s", "tokens/s")};
  LineChart comm;
  comm.title = "Communication per step (ms)";
  comm.x_label = "step";
  comm.series = {series_of(all, "comm_ms", "on the communication thread"),
                 series_of(all, "exposed_comm_ms", "exposed (compute thread waiting)")};
  s += "<div class=\"grid\">" + line_chart_svg(loss) + line_chart_svg(speed) + line_chart_svg(comm) +
       "</div>\n";

  StackedBars phases;
  phases.title = "Step time by phase (ms); communication = exposed wait";
  phases.y_label = "ms";
  phases.categories = kPhases;
  phases.colors = kPhaseColors;
  phases.values.assign(kPhases.size(), {});
  const size_t every = std::max<size_t>(1, run.records.size() / 40);
  for (size_t i = 0; i < run.records.size(); i += every) {
    const auto& r = run.records[i];
    if (!r.contains("phase_ms")) continue;
    phases.bars.push_back(fmt::format("step {}", r.value("step", 0)));
    for (size_t k = 0; k < kPhases.size(); ++k)
      phases.values[k].push_back(r.at("phase_ms").value(kPhases[k], 0.0));
  }
  phases.width = std::max(640, 40 * static_cast<int>(phases.bars.size()) + 120);
  StackedBars memory = memory_chart("Memory by category per rank (peak)");
  memory_bars(run, "", memory);
  s += "<div class=\"grid\">" + stacked_bars_svg(phases) + stacked_bars_svg(memory) + "</div>\n";

  s += "<h2>" + escape_html(heading_prefix) + "Every series in metrics.jsonl</h2><div class=\"grid\">";
  for (const auto& [key, series] : all) s += sparkline_svg(key, series.step, series.value);
  return s + "</div>\n";
}

}  // namespace

std::string run_report_html(const RunMetrics& run) {
  return page("shardlm run: " + label_of(run), run_sections(run, ""));
}

std::string bench_report_html(const BenchResult& bench, const std::vector<RunMetrics>& runs) {
  std::string s;
  std::vector<std::vector<std::string>> setup;
  for (auto it = bench.setup.begin(); it != bench.setup.end(); ++it)
    setup.push_back({it.key(), it.value().is_string() ? it.value().get<std::string>() : it.value().dump()});
  s += table({"setup", ""}, setup, "kv");

  std::vector<std::vector<std::string>> rows;
  for (const auto& r : bench.rows) {
    const auto& m = r.measured;
    const auto& p = r.predicted;
    // Per rank, the categories both sides count.
    const double peak = counted_memory_bytes(m.peak_bytes), planned = counted_memory_bytes(r.planned_bytes);
    const auto pr = [&](double v) { return p.available ? fmt::format("{:.0f}", v) : std::string("-"); };
    const auto ratio = [&](double a, double b) {
      return p.available && b > 0 ? fmt::format("{:.2f}", a / b) : std::string("-");
    };
    rows.push_back({r.label, fmt::format("{:.0f}", m.tokens_per_s), pr(p.tokens_per_s),
                    ratio(m.tokens_per_s, p.tokens_per_s), fmt::format("{:.0f}", m.step_ms),
                    pr(p.step_ms), ratio(m.step_ms, p.step_ms),
                    fmt::format("{:.0f}", m.exposed_comm_ms), pr(p.exposed_comm_ms),
                    fmt::format("{:.1f}", mib(m.comm_bytes)), fmt::format("{:.1f}", mib(r.planned_wire_bytes)),
                    fmt::format("{:.1f}", mib(peak)), fmt::format("{:.1f}", mib(planned)), r.flags});
  }
  s += "<h2>Measured next to predicted</h2>";
  s += table({"run", "tokens/s", "predicted", "ratio", "step ms", "predicted", "ratio",
              "exposed comm ms", "predicted", "MiB on wire", "planned", "peak MiB per rank",
              "planned", "flags"},
             rows);
  s += "<p class=\"note\">Measured: medians of the steps after the first, rank 0. Predicted: "
       "`shardlm plan`'s step-time model on the bench's hardware profile (docs/planning.md). "
       "Ratio: measured / predicted.</p>\n";

  StackedBars time;
  time.title = "Step time: measured phases vs predicted (ms)";
  time.y_label = "ms";
  // Compute at the bottom of measured and predicted bars alike, communication above.
  time.categories = {"compute (measured phases)", "compute (predicted)", "exposed communication",
                     "overlap cost (predicted)", "other (measured)"};
  time.colors = {"#0072B2", "#56B4E9", "#D55E00", "#E69F00", "#BBBBBB"};
  time.values.assign(5, {});
  StackedBars speed;
  speed.title = "Tokens/s: measured vs predicted";
  speed.y_label = "tokens/s";
  speed.categories = {"measured", "predicted"};
  speed.colors = {"#0072B2", "#E69F00"};
  speed.values.assign(2, {});
  StackedBars memory = memory_chart("Memory by category per rank: measured (peak) and planned");
  for (size_t i = 0; i < bench.rows.size(); ++i) {
    const auto& r = bench.rows[i];
    double compute = 0;
    for (const char* k : {"gemm", "attention", "norms_elementwise", "loss", "optimizer"})
      compute += r.measured.phase_ms.count(k) ? r.measured.phase_ms.at(k) : 0;
    const double other = r.measured.phase_ms.count("other") ? r.measured.phase_ms.at("other") : 0;
    time.bars.push_back(r.label + " measured");
    const double measured[] = {compute, 0, r.measured.exposed_comm_ms, 0, std::max(0.0, other)};
    for (size_t k = 0; k < 5; ++k) time.values[k].push_back(measured[k]);
    speed.bars.push_back(r.label + " measured");
    speed.values[0].push_back(r.measured.tokens_per_s);
    speed.values[1].push_back(0);
    if (r.predicted.available) {
      time.bars.push_back(r.label + " predicted");
      const double predicted[] = {0, r.predicted.compute_ms, r.predicted.exposed_comm_ms,
                                  r.predicted.overlap_cost_ms, 0};
      for (size_t k = 0; k < 5; ++k) time.values[k].push_back(predicted[k]);
      speed.bars.push_back(r.label + " predicted");
      speed.values[0].push_back(0);
      speed.values[1].push_back(r.predicted.tokens_per_s);
    }
    if (i < runs.size()) memory_bars(runs[i], r.label + " ", memory);
    memory.bars.push_back(r.label + " planned");
    for (size_t k = 0; k < kMemory.size(); ++k)
      memory.values[k].push_back(mib(r.planned_bytes.count(kMemory[k]) ? r.planned_bytes.at(kMemory[k]) : 0));
  }
  for (StackedBars* c : {&time, &speed, &memory})
    c->width = std::max(640, 46 * static_cast<int>(c->bars.size()) + 120);
  s += "<div class=\"grid\">" + stacked_bars_svg(time) + stacked_bars_svg(speed) + "</div>\n";
  s += stacked_bars_svg(memory);

  LineChart loss;
  loss.title = "Loss of every run (same data order: strategies agree)";
  loss.x_label = "step";
  for (size_t i = 0; i < runs.size() && i < bench.rows.size(); ++i)
    loss.series.push_back(series_of(numeric_series(runs[i]), "loss", bench.rows[i].label));
  s += line_chart_svg(loss);

  for (size_t i = 0; i < runs.size() && i < bench.rows.size(); ++i)
    s += "<details><summary>" + escape_html(bench.rows[i].label) + ": the run's own report</summary>" +
         run_sections(runs[i], bench.rows[i].label + ": ") + "</details>\n";
  return page("shardlm bench: measured vs predicted", s);
}

}  // namespace shardlm::report
