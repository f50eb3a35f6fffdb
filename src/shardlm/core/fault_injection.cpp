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

}  // namespace shardlm
