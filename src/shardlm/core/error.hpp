// Errors: one exception type carrying a one-line, user-facing message.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace shardlm {

// Thrown for bad input and failed invariants. The CLI prints `error: <what()>`
// and exits non-zero, so messages must name what was wrong and what was expected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace shardlm

// SHARDLM_CHECK(cond, "fmt {}", args...): throw shardlm::Error with the message.
#define SHARDLM_CHECK(cond, ...)                                     \
  do {                                                               \
    if (!(cond)) throw ::shardlm::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

// Internal invariants (bugs, not bad input): message carries file and line.
#define SHARDLM_ASSERT(cond)                                                          \
  do {                                                                                \
    if (!(cond))                                                                      \
      throw ::shardlm::Error(::fmt::format("internal error: {} failed at {}:{}", #cond, \
                                           __FILE__, __LINE__));                      \
  } while (0)
