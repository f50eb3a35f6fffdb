#include "shardlm/train/gsm8k.hpp"

#include <cctype>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_number_char(char c) { return is_digit(c) || c == '.' || c == ','; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The strict-match filter: `#### (\-?[0-9\.\,]+)`, the first such match.
std::optional<std::string> strict_match(std::string_view text) {
  for (size_t at = text.find("#### "); at != std::string_view::npos; at = text.find("#### ", at + 1)) {
    size_t i = at + 5;
    std::string number;
    if (i < text.size() && text[i] == '-') number += text[i++];
    while (i < text.size() && is_number_char(text[i])) number += text[i++];
    if (!number.empty() && number.size() > (number.front() == '-' ? 1u : 0u)) return number;
  }
  return std::nullopt;
}

// The flexible-extract filter: `(-?[$0-9.,]{2,})|(-?[0-9]+)`, the last match. Matches
// are found left to right, each starting where the previous one ended (re.findall).
std::optional<std::string> flexible_match(std::string_view text) {
  std::optional<std::string> found;
  auto money_char = [](char c) { return is_number_char(c) || c == '$'; };
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    size_t j = i + (text[i] == '-' ? 1 : 0);
    size_t k = j;
    while (k < text.size() && money_char(text[k])) ++k;
    if (k - j >= 2) {  // first alternative
      found = std::string(text.substr(start, k - start));
      i = k;
      continue;
    }
    k = j;
    while (k < text.size() && is_digit(text[k])) ++k;
    if (k > j) {  // second alternative
      found = std::string(text.substr(start, k - start));
      i = k;
      continue;
    }
    ++i;
  }
  return found;
}

}  // namespace

std::string gsm8k_normalize(std::string_view answer) {
  std::string out;
  for (char c : trim(answer))
    if (c != ',' && c != '$') out += c;
  const std::string_view t = trim(out);
  out = std::string(t);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

std::optional<std::string> gsm8k_reference_answer(std::string_view response) {
  const size_t at = response.rfind("####");
  if (at == std::string_view::npos) return std::nullopt;
  return gsm8k_normalize(response.substr(at + 4));
}

std::optional<std::string> gsm8k_extract_answer(std::string_view generated) {
  std::optional<std::string> answer = strict_match(generated);
  if (!answer) answer = flexible_match(generated);
  if (!answer) return std::nullopt;
  std::string normalized = gsm8k_normalize(*answer);
  // "$." or "," alone matched the first alternative but hold no digit: no number.
  bool has_digit = false;
  for (char c : normalized) has_digit = has_digit || is_digit(c);
  if (!has_digit) return std::nullopt;
  return normalized;
}

bool Gsm8kScore::add(std::string_view generated, std::string_view reference_response) {
  const auto reference = gsm8k_reference_answer(reference_response);
  SHARDLM_CHECK(reference.has_value(), "GSM8K reference answer without \"#### N\": '{}'",
                reference_response.substr(0, 80));
  ++total;
  const auto answer = gsm8k_extract_answer(generated);
  if (!answer) {
    ++without_answer;
    return false;
  }
  const bool match = *answer == *reference;
  correct += match ? 1 : 0;
  return match;
}

}  // namespace shardlm
