#include "shardlm/data/pcre2_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <memory>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"

namespace shardlm {
namespace {

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(code, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};

}  // namespace

Pcre2Regex::Pcre2Regex(std::string_view pattern, std::string_view what) : pattern_(pattern), what_(what) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: invalid bytes are simply never matched (instead of the
  // whole subject being rejected), and no per-call UTF validation scan is made.
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset, nullptr);
  SHARDLM_CHECK(code_ != nullptr, "{} {} is not a valid regular expression at offset {}: {}", what_,
                nlohmann::json(pattern_).dump(), error_offset, pcre2_message(error_code));
  // Without JIT the interpreter still gives the same matches, only slower.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(code_); }

size_t Pcre2Regex::find_matches(std::string_view text, size_t start, std::vector<TextSpan>& matches,
                                size_t max_matches) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(pcre2_match_data_create_from_pattern(code_, nullptr));
  SHARDLM_CHECK(match != nullptr, "out of memory creating PCRE2 match data");
  // A long whitespace run backtracks through \s+(?!\S); give JIT a stack that
  // grows on demand instead of its 32 KiB default.
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context(pcre2_match_context_create(nullptr));
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack(
      pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr));
  SHARDLM_CHECK(context != nullptr && jit_stack != nullptr, "out of memory creating PCRE2 match context");
  pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get());

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t cursor = start;
  size_t found = 0;
  while (cursor < text.size() && found < max_matches) {
    const int rc = pcre2_match(code_, subject, text.size(), cursor, 0, match.get(), context.get());
    if (rc == PCRE2_ERROR_NOMATCH) return text.size();
    SHARDLM_CHECK(rc > 0, "{} failed at byte {}: {}", what_, cursor, pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    SHARDLM_ASSERT(ovector[1] >= ovector[0] && ovector[0] >= cursor);
    if (ovector[1] == ovector[0]) {  // empty match: look again one byte further on
      cursor = ovector[0] + 1;
      continue;
    }
    matches.push_back({ovector[0], ovector[1]});
    ++found;
    cursor = ovector[1];
  }
  return cursor;
}

}  // namespace shardlm
