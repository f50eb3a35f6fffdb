// GSM8K scoring as lm-evaluation-harness's gsm8k task scores it (docs/generation.md):
// exact match of the final number.
//  - The reference answer is what follows the last "####" of the dataset's response
//    ("#### 18"), trimmed.
//  - The model's answer is the number after its first "#### " when it wrote one (the
//    harness's strict-match filter, regex `#### (\-?[0-9\.\,]+)`, first match; the
//    harness reports it as its own metric, shardlm falls back to:), else the last number
//    in its reply (the flexible-extract filter, regex `(-?[$0-9.,]{2,})|(-?[0-9]+)`,
//    last match); none: no answer, counted wrong.
//  - Both are normalized as the harness's regexes_to_ignore do (",", "$", a trailing
//    "." removed) and compared as strings: "1,234" matches "1234", "-3" matches "-3",
//    but "18.00" does not match "18" (as in the harness).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardlm {

// ",", "$" removed, surrounding white space and one trailing "." dropped.
std::string gsm8k_normalize(std::string_view answer);
// The dataset's answer (after the last "####"), normalized; nullopt without "####".
std::optional<std::string> gsm8k_reference_answer(std::string_view response);
// The model's answer, normalized; nullopt when its text holds no number.
std::optional<std::string> gsm8k_extract_answer(std::string_view generated);

struct Gsm8kScore {
  int64_t correct = 0;
  int64_t total = 0;
  int64_t without_answer = 0;  // replies holding no number (counted wrong)
  double accuracy() const { return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
  // Scores one reply against the dataset's response; returns whether it matched.
  bool add(std::string_view generated, std::string_view reference_response);
};

}  // namespace shardlm
