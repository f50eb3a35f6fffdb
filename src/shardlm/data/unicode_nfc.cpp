#include "shardlm/data/unicode_nfc.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "shardlm/data/utf8.hpp"

namespace shardlm {
namespace {

struct CombiningClassRange {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t code_point;
  char32_t first;
  char32_t second;  // 0: a singleton
};
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};
struct CodePointRange {
  char32_t first;
  char32_t last;
};

#include "shardlm/data/unicode_nfc_tables.inc"

// Hangul syllables (UAX #15 / Unicode ch. 3.12): composed and decomposed by arithmetic.
constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161,
                   kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulNCount;

// Invalid UTF-8 bytes travel as code points above U+10FFFF: class 0, no mapping.
constexpr char32_t kRawByteBase = 0x110000;

bool is_unstable(char32_t cp) {
  if (cp < 0x300) return false;
  const auto it = std::upper_bound(std::begin(kUnstableRanges), std::end(kUnstableRanges), cp,
                                   [](char32_t value, const CodePointRange& r) { return value < r.first; });
  return it != std::begin(kUnstableRanges) && cp <= std::prev(it)->last;
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto it = std::upper_bound(std::begin(kCombiningClassRanges), std::end(kCombiningClassRanges), cp,
                                   [](char32_t value, const CombiningClassRange& r) { return value < r.first; });
  return it != std::begin(kCombiningClassRanges) && cp <= std::prev(it)->last ? std::prev(it)->ccc : 0;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const char32_t index = cp - kHangulSBase;
    out.push_back(kHangulLBase + index / kHangulNCount);
    out.push_back(kHangulVBase + (index % kHangulNCount) / kHangulTCount);
    if (index % kHangulTCount != 0) out.push_back(kHangulTBase + index % kHangulTCount);
    return;
  }
  const auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                                   [](const Decomposition& d, char32_t value) { return d.code_point < value; });
  if (it == std::end(kDecompositions) || it->code_point != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

// The primary composite of (first, second), or 0.
char32_t compose_pair(char32_t first, char32_t second) {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount)
    return kHangulSBase + ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) * kHangulTCount;
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount && (first - kHangulSBase) % kHangulTCount == 0 &&
      second > kHangulTBase && second < kHangulTBase + kHangulTCount)
    return first + (second - kHangulTBase);
  const auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::pair{first, second},
                                   [](const Composition& c, const std::pair<char32_t, char32_t>& key) {
                                     return c.first != key.first ? c.first < key.first : c.second < key.second;
                                   });
  return it != std::end(kCompositions) && it->first == first && it->second == second ? it->composite : 0;
}

// NFC of one run of code points in place: full decomposition, canonical ordering
// (stable sort by class within each stretch of non-starters), then composition of
// each unblocked character with the last starter.
void normalize_run(std::vector<char32_t>& run, std::vector<char32_t>& scratch) {
  scratch.clear();
  for (char32_t cp : run) decompose(cp, scratch);
  run.swap(scratch);
  for (size_t i = 0; i < run.size();) {
    if (combining_class(run[i]) == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < run.size() && combining_class(run[end]) != 0) ++end;
    std::stable_sort(run.begin() + static_cast<std::ptrdiff_t>(i), run.begin() + static_cast<std::ptrdiff_t>(end),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = end;
  }
  size_t starter = SIZE_MAX;  // index (in the output) of the last starter
  size_t out = 0;
  int last_class = -1;  // class of the last character kept after the starter; -1: none
  for (size_t i = 0; i < run.size(); ++i) {
    const char32_t cp = run[i];
    const int cls = combining_class(cp);
    if (starter != SIZE_MAX && (last_class == -1 || (last_class != 0 && last_class < cls))) {
      if (const char32_t composite = compose_pair(run[starter], cp); composite != 0) {
        run[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = out;
      last_class = -1;
    } else {
      last_class = cls;
    }
    run[out++] = cp;
  }
  run.resize(out);
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp >= kRawByteBase)
    out.push_back(static_cast<char>(cp - kRawByteBase));
  else
    utf8::append(out, cp);
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  // Find the first unstable code point; text before the stable code point that
  // precedes it is final.
  size_t pos = 0;
  size_t run_start = 0;  // byte offset of the last stable code point seen
  bool any_unstable = false;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      run_start = pos++;
      continue;
    }
    const size_t at = pos;
    const std::optional<char32_t> cp = utf8::decode(text, pos);
    if (!cp) {
      run_start = pos++;
      continue;
    }
    if (is_unstable(*cp)) {
      any_unstable = true;
      break;
    }
    run_start = at;
  }
  if (!any_unstable) return std::string(text);

  // From run_start on: cut the code points into runs that each begin with a stable
  // code point (or an invalid byte) and normalize each run on its own; NFC never
  // combines across a stable code point.
  std::string out(text.substr(0, run_start));
  out.reserve(text.size() + 16);
  std::vector<char32_t> run, scratch;
  auto flush = [&] {
    if (run.size() == 1 && (run[0] >= kRawByteBase || !is_unstable(run[0]))) {
      append_code_point(out, run[0]);
    } else if (!run.empty()) {
      normalize_run(run, scratch);
      for (char32_t cp : run) append_code_point(out, cp);
    }
    run.clear();
  };
  pos = run_start;
  while (pos < text.size()) {
    const std::optional<char32_t> decoded = utf8::decode(text, pos);
    char32_t cp;
    bool stable;
    if (decoded) {
      cp = *decoded;
      stable = !is_unstable(cp);
    } else {
      cp = kRawByteBase + static_cast<unsigned char>(text[pos++]);
      stable = true;
    }
    if (stable) flush();
    run.push_back(cp);
  }
  flush();
  return out;
}

const char* nfc_unicode_version() { return kUnicodeVersion; }

}  // namespace shardlm
