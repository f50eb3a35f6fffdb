#include "shardlm/data/tokenizer.hpp"

#include <filesystem>

#include "shardlm/core/error.hpp"
#include "shardlm/data/byte_tokenizer.hpp"
#include "shardlm/data/gpt2_tokenizer.hpp"
#include "shardlm/data/hf_tokenizer.hpp"
#include "shardlm/data/tiktoken_tokenizer.hpp"

namespace shardlm {
namespace {

constexpr std::string_view kExpectedSpecs =
    "expected byte, gpt2:DIR, hf:DIR (or a directory holding tokenizer.json) or tiktoken:[qwen:]FILE";
constexpr std::string_view kHashMarker = "#sha256=";

// Splits "PATH#sha256=HEX" into PATH and HEX (empty when there is no marker).
std::pair<std::string, std::string> split_hash(const std::string& spec, const std::string& rest) {
  const size_t marker = rest.rfind(kHashMarker);
  if (marker == std::string::npos) return {rest, ""};
  std::string hex = rest.substr(marker + kHashMarker.size());
  SHARDLM_CHECK(hex.size() == 64 && hex.find_first_not_of("0123456789abcdef") == std::string::npos,
                "tokenizer spec '{}': '{}' after {} (expected 64 lowercase hex digits)", spec, hex, kHashMarker);
  return {rest.substr(0, marker), std::move(hex)};
}

}  // namespace

TokenizerSpec parse_tokenizer_spec(const std::string& spec) {
  TokenizerSpec parsed;
  if (spec == "byte") {
    parsed.kind = "byte";
    return parsed;
  }
  const size_t colon = spec.find(':');
  const std::string prefix = colon == std::string::npos ? "" : spec.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (prefix == "gpt2") {
    parsed.kind = "gpt2";
    parsed.path = rest;
    SHARDLM_CHECK(!rest.empty(), "tokenizer spec '{}' names no directory (expected gpt2:DIR with DIR/vocab.json "
                  "and DIR/merges.txt)", spec);
  } else if (prefix == "hf") {
    parsed.kind = "hf";
    std::tie(parsed.path, parsed.sha256) = split_hash(spec, rest);
    SHARDLM_CHECK(!parsed.path.empty(), "tokenizer spec '{}' names no directory (expected hf:DIR with "
                  "DIR/tokenizer.json)", spec);
  } else if (prefix == "tiktoken") {
    parsed.kind = "tiktoken";
    parsed.preset = "qwen";
    std::string path = rest;
    if (const size_t next = rest.find(':'); next != std::string::npos && next > 0 &&
                                            rest.substr(0, next).find('/') == std::string::npos) {
      parsed.preset = rest.substr(0, next);
      path = rest.substr(next + 1);
    }
    tiktoken_preset(parsed.preset);  // Error for an unknown preset
    std::tie(parsed.path, parsed.sha256) = split_hash(spec, path);
    SHARDLM_CHECK(!parsed.path.empty(), "tokenizer spec '{}' names no file (expected tiktoken:[qwen:]FILE)", spec);
  } else if (!spec.empty() && std::filesystem::is_regular_file(std::filesystem::path(spec) / "tokenizer.json")) {
    parsed.kind = "hf";
    parsed.path = spec;
  } else if (!spec.empty() && std::filesystem::is_directory(spec)) {
    throw Error(fmt::format("tokenizer directory '{}' has no tokenizer.json (expected a Hugging Face tokenizer "
                            "directory; use gpt2:DIR for GPT-2's vocab.json + merges.txt)", spec));
  } else {
    throw Error(fmt::format("unknown tokenizer '{}' ({})", spec, kExpectedSpecs));
  }
  return parsed;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  const TokenizerSpec parsed = parse_tokenizer_spec(spec);
  if (parsed.kind == "byte") return std::make_unique<ByteTokenizer>();
  if (parsed.kind == "gpt2") return std::make_unique<Gpt2Tokenizer>(parsed.path);
  if (parsed.kind == "hf") return std::make_unique<HfTokenizer>(parsed.path, parsed.sha256);
  return std::make_unique<TiktokenTokenizer>(parsed.path, tiktoken_preset(parsed.preset), parsed.sha256);
}

}  // namespace shardlm
