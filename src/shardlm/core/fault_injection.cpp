#include "shardlm/core/fault_injection.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "shardlm/core/error.hpp"

namespace shardlm {

void fault_point(std::string_view point) {
  const char* spec = std::getenv("SHARDLM_FAULT");
  if (spec == nullptr) return;
  std::string_view s(spec);
  const bool exit_now = s.size() > 5 && s.substr(s.size() - 5) == ":exit";
  if (exit_now) s.remove_suffix(5);
  if (s != point) return;
  if (exit_now) {
    std::fprintf(stderr, "fault injected at %.*s: exiting\n", static_cast<int>(point.size()),
                 point.data());
    ::_exit(43);
  }
  throw Error(fmt::format("fault injected at {}", point));
}

std::optional<std::string> fault_value(std::string_view point) {
  const char* spec = std::getenv("SHARDLM_FAULT");
  if (spec == nullptr) return std::nullopt;
  const std::string_view s(spec);
  if (s.size() <= point.size() || s.substr(0, point.size()) != point || s[point.size()] != '=')
    return std::nullopt;
  return std::string(s.substr(point.size() + 1));
}

void fault_at_step(int rank, int64_t step) {
  const char* fault = std::getenv("SHARDLM_FAULT_STEP");
  if (fault == nullptr) return;
  int fault_rank = -1;
  long long fault_step = -1;
  char mode[16] = "";
  const char* restart = std::getenv("SHARDLM_RESTART_COUNT");
  const bool first_attempt = restart == nullptr || std::string_view(restart) == "0";
  if (std::sscanf(fault, "%d:%lld:%15s", &fault_rank, &fault_step, mode) >= 2 &&
      fault_rank == rank && fault_step == step &&
      (first_attempt || std::string_view(mode) == "always")) {
    std::fprintf(stderr, "rank %d: fault injected at step %lld: exiting\n", rank, fault_step);
    std::_Exit(43);
  }
}

bool disk_full_injected(std::string_view path) {
  const char* full = std::getenv("SHARDLM_FAULT_DISK_FULL");
  return full != nullptr && *full != '\0' && path.find(full) != std::string_view::npos;
}

}  // namespace shardlm
