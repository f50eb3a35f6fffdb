#include "shardlm/train/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace shardlm {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

bool stdout_is_watched() {
  if (const char* v = std::getenv("SHARDLM_STDOUT_TTY"); v != nullptr && *v != '\0')
    return std::string_view(v) == "1";
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return false;
  return ::isatty(STDOUT_FILENO) == 1;
}

ProgressLine::ProgressLine(int64_t total_steps, int64_t log_every)
    : total_steps_(total_steps), log_every_(log_every < 1 ? 1 : log_every),
      is_tty_(stdout_is_watched()) {}

void ProgressLine::update(int64_t step, double loss, double lr, double tokens_per_s,
                          double eta_s) {
  std::string text = fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | ETA {}",
                                 step, fmt::formatted_size("{}", total_steps_), total_steps_, loss,
                                 lr, tokens_per_s, format_duration(eta_s));
  if (is_tty_) {
    std::fputs(("\r\033[K" + text).c_str(), stdout);
    line_open_ = true;
  } else if (step % log_every_ == 0 || step == total_steps_ || step == 1) {
    std::fputs((text + "\n").c_str(), stdout);
  }
  std::fflush(stdout);
}

void ProgressLine::message(const std::string& text) {
  if (line_open_) std::fputs("\r\033[K", stdout);
  std::fputs((text + "\n").c_str(), stdout);
  line_open_ = false;
  std::fflush(stdout);
}

void ProgressLine::finish() {
  if (line_open_) std::fputs("\n", stdout);
  line_open_ = false;
  std::fflush(stdout);
}

}  // namespace shardlm
