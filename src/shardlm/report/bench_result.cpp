#include "shardlm/report/bench_result.hpp"

#include <fmt/format.h>

#include "shardlm/core/error.hpp"

namespace shardlm::report {

namespace {

nlohmann::json steady_json(const SteadyState& s) {
  return {{"steps", s.steps},           {"step_ms", s.step_ms},
          {"tokens_per_s", s.tokens_per_s}, {"comm_ms", s.comm_ms},
          {"exposed_comm_ms", s.exposed_comm_ms}, {"comm_bytes", s.comm_bytes},
          {"phase_ms", s.phase_ms},     {"peak_bytes", s.peak_bytes}};
}

SteadyState steady_from(const nlohmann::json& j) {
  SteadyState s;
  s.steps = j.at("steps").get<int>();
  s.step_ms = j.at("step_ms").get<double>();
  s.tokens_per_s = j.at("tokens_per_s").get<double>();
  s.comm_ms = j.at("comm_ms").get<double>();
  s.exposed_comm_ms = j.at("exposed_comm_ms").get<double>();
  s.comm_bytes = j.at("comm_bytes").get<double>();
  s.phase_ms = j.at("phase_ms").get<std::map<std::string, double>>();
  s.peak_bytes = j.at("peak_bytes").get<std::map<std::string, double>>();
  return s;
}

std::string ratio(double measured, double predicted) {
  return predicted > 0 ? fmt::format("{:.2f}", measured / predicted) : "-";
}

}  // namespace

nlohmann::json BenchResult::to_json() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json p = nullptr;
    if (r.predicted.available)
      p = {{"step_ms", r.predicted.step_ms},           {"tokens_per_s", r.predicted.tokens_per_s},
           {"compute_ms", r.predicted.compute_ms},     {"comm_ms", r.predicted.comm_ms},
           {"exposed_comm_ms", r.predicted.exposed_comm_ms},
           {"overlap_cost_ms", r.predicted.overlap_cost_ms}};
    rows_json.push_back({{"label", r.label},
                         {"flags", r.flags},
                         {"run_dir", r.run_dir},
                         {"measured", steady_json(r.measured)},
                         {"predicted", p},
                         {"planned_wire_bytes", r.planned_wire_bytes},
                         {"planned_bytes", r.planned_bytes}});
  }
  return {{"setup", setup}, {"runs", rows_json}};
}

BenchResult BenchResult::from_json(const nlohmann::json& j) {
  BenchResult b;
  try {
    b.setup = j.at("setup");
    for (const auto& r : j.at("runs")) {
      BenchRow row;
      row.label = r.at("label").get<std::string>();
      row.flags = r.at("flags").get<std::string>();
      row.run_dir = r.at("run_dir").get<std::string>();
      row.measured = steady_from(r.at("measured"));
      if (!r.at("predicted").is_null()) {
        const auto& p = r.at("predicted");
        row.predicted = {true,
                         p.at("step_ms").get<double>(),
                         p.at("tokens_per_s").get<double>(),
                         p.at("compute_ms").get<double>(),
                         p.at("comm_ms").get<double>(),
                         p.at("exposed_comm_ms").get<double>(),
                         p.at("overlap_cost_ms").get<double>()};
      }
      row.planned_wire_bytes = r.at("planned_wire_bytes").get<double>();
      row.planned_bytes = r.at("planned_bytes").get<std::map<std::string, double>>();
      b.rows.push_back(std::move(row));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("bench.json: {}", e.what()));
  }
  return b;
}

std::string bench_table(const BenchResult& b) {
  std::string t =
      "| run | tokens/s measured | predicted | ratio | step ms measured | predicted | ratio | "
      "exposed comm ms measured | predicted | MiB on wire measured | planned | peak MiB per rank "
      "measured | planned |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : b.rows) {
    const auto& m = r.measured;
    const auto& p = r.predicted;
    const double peak = counted_memory_bytes(m.peak_bytes), planned = counted_memory_bytes(r.planned_bytes);
    const auto pred = [&](double v, const char* f) { return p.available ? fmt::format(fmt::runtime(f), v) : std::string("-"); };
    t += fmt::format("| {} | {:.0f} | {} | {} | {:.0f} | {} | {} | {:.0f} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n",
                     r.label, m.tokens_per_s, pred(p.tokens_per_s, "{:.0f}"),
                     p.available ? ratio(m.tokens_per_s, p.tokens_per_s) : "-", m.step_ms,
                     pred(p.step_ms, "{:.0f}"), p.available ? ratio(m.step_ms, p.step_ms) : "-",
                     m.exposed_comm_ms, pred(p.exposed_comm_ms, "{:.0f}"), m.comm_bytes / (1 << 20),
                     r.planned_wire_bytes / (1 << 20), peak / (1 << 20), planned / (1 << 20));
  }
  return t;
}

}  // namespace shardlm::report
