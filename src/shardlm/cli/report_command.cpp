// `shardlm report RUN_or_BENCH_DIR`: one self-contained HTML file (inline SVG) of a
// training run's metrics, or of a bench's runs with plan's predictions beside them.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "shardlm/cli/commands.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/report/html_report.hpp"

namespace fs = std::filesystem;

namespace shardlm::cli {

std::string write_report(const std::string& dir, const std::string& out_path) {
  std::string html;
  const fs::path bench_json = fs::path(dir) / "bench.json";
  if (fs::exists(bench_json)) {
    std::ifstream in(bench_json);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("'{}' is not valid JSON: {}", bench_json.string(), e.what()));
    }
    const report::BenchResult bench = report::BenchResult::from_json(j);
    std::vector<report::RunMetrics> runs;
    for (const auto& row : bench.rows) runs.push_back(report::load_run((fs::path(dir) / row.run_dir).string()));
    html = report::bench_report_html(bench, runs);
  } else {
    html = report::run_report_html(report::load_run(dir));
  }
  const std::string out = out_path.empty() ? (fs::path(dir) / "report.html").string() : out_path;
  write_file_atomic(out, html);
  return out;
}

void register_report(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "report", "Write one self-contained HTML report (inline SVG charts) of a run or bench directory");
  cmd->add_option("dir", *dir, "A run directory (metrics.jsonl) or a bench directory (bench.json)")
      ->required();
  cmd->add_option("--out", *out, "HTML file to write (default: DIR/report.html)");
  cmd->callback([dir, out]() {
    std::printf("report written to %s\n", write_report(*dir, *out).c_str());
  });
}

}  // namespace shardlm::cli
