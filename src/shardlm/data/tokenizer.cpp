#include "shardlm/data/tokenizer.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/data/byte_tokenizer.hpp"
#include "shardlm/data/gpt2_tokenizer.hpp"

namespace shardlm {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  constexpr std::string_view kGpt2Prefix = "gpt2:";
  if (spec.starts_with(kGpt2Prefix)) {
    const std::string dir = spec.substr(kGpt2Prefix.size());
    SHARDLM_CHECK(!dir.empty(),
                  "tokenizer spec '{}' names no directory (expected gpt2:DIR with "
                  "DIR/vocab.json and DIR/merges.txt)",
                  spec);
    return std::make_unique<Gpt2Tokenizer>(dir);
  }
  throw Error(fmt::format("unknown tokenizer '{}' (expected 'byte' or 'gpt2:DIR')", spec));
}

}  // namespace shardlm
