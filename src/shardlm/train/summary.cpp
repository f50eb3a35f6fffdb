#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "shardlm/train/stop_signals.hpp"
#include "shardlm/train/trainer.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

std::string with_thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

double percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

}  // namespace

std::string trainable_params_line(int64_t trainable, int64_t all) {
  return fmt::format("trainable params: {} || all params: {} || trainable%: {:.4f}",
                     with_thousands(trainable), with_thousands(all), percent(trainable, all));
}

void print_summary(const TrainSummary& s) {
  if (!s.is_root) return;
  auto mib = [](size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); };
  std::string table;
  auto row = [&](const std::string& key, const std::string& value) {
    table += fmt::format("| {:<28} | {:>30} |\n", key, value);
  };
  table += fmt::format("| {:<28} | {:>30} |\n", "summary", "");
  table += fmt::format("|{:-<30}|{:->32}|\n", "", "");
  row("steps", s.first_step > 0 ? fmt::format("{} (resumed at {})", s.steps, s.first_step)
                                : fmt::format("{}", s.steps));
  row("parameters", fmt::format("{:.2f}M", static_cast<double>(s.num_parameters) / 1e6));
  row("trainable params", fmt::format("{} ({:.2f}% of {:.2f}M)", with_thousands(s.num_trainable_parameters),
                                      percent(s.num_trainable_parameters, s.num_parameters),
                                      static_cast<double>(s.num_parameters) / 1e6));
  row("tokens trained", fmt::format("{}", s.tokens));
  row("first train loss", std::isfinite(s.first_loss) ? fmt::format("{:.4f}", s.first_loss) : "-");
  row("final train loss", std::isfinite(s.final_train_loss) ? fmt::format("{:.4f}", s.final_train_loss) : "-");
  row("final val loss", s.final_val_loss > 0 ? fmt::format("{:.4f}", s.final_val_loss) : "-");
  row("tokens/s (median step)", fmt::format("{:.0f}", s.tokens_per_s));
  row("tokens/s incl. eval+save", fmt::format("{:.0f}", s.tokens_per_s_incl_eval_save));
  row("wall time", fmt::format("{:.1f} s", s.wall_s));
  const auto& peak = s.memory.at("peak");
  for (auto it = peak.begin(); it != peak.end(); ++it)
    row("peak memory: " + it.key(), mib(it.value().get<size_t>()));
  row("peak memory: total", mib(s.memory.at("peak_total").get<size_t>()));
  if (!s.last_checkpoint.empty()) row("checkpoint", fs::path(s.last_checkpoint).filename().string());
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
}

void exit_if_stopped(const TrainSummary& s) {
  if (s.stopped.empty()) return;
  // On stdout, after the summary: mpirun forwards a rank's stdout and stderr through
  // separate pipes, so a stderr line could land inside the table (it did, in CI).
  if (s.is_root) std::printf("%s\n", s.stopped.c_str());
  std::fflush(stdout);
  std::exit(kExitStoppedAtCheckpoint);
}

}  // namespace shardlm
