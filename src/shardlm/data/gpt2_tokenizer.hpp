// GPT-2 byte-level BPE, matching OpenAI's encoder.py / Hugging Face's GPT-2
// tokenizer id for id: regex pre-tokenization (gpt2_pretokenizer.hpp), bytes
// mapped through GPT-2's byte table, then merges applied lowest rank first.
#pragma once

#include <array>
#include <string>
#include <unordered_map>

#include "shardlm/data/added_tokens.hpp"
#include "shardlm/data/bpe.hpp"
#include "shardlm/data/gpt2_pretokenizer.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Loads dir/vocab.json and dir/merges.txt; Error naming the file and line on
  // anything missing or malformed.
  explicit Gpt2Tokenizer(const std::string& dir);

  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }
  std::string spec() const override { return "gpt2:" + dir_; }
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }
  // "<|endoftext|>" is GPT-2's only special token.
  std::optional<int32_t> special_token_id(std::string_view text) const override;

 protected:
  std::vector<int32_t> encode_text(std::string_view text, SpecialTokens specials) const override;

 private:
  void load_vocab(const std::string& path);
  void load_merges(const std::string& path);

  std::string dir_;  // absolute
  std::vector<std::string> token_bytes_;  // id -> raw bytes
  IdOfBytes id_of_bytes_;
  BpeWordEncoder words_;  // merge priority = line of merges.txt
  std::optional<int32_t> end_of_text_;
  AddedTokenMatcher special_tokens_;  // <|endoftext|>
  Pcre2Regex regex_{gpt2::kPattern, "GPT-2 pre-tokenizer regex"};
};

}  // namespace shardlm
