// A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3,
// Qwen2/2.5/3 and their kin), giving the ids Hugging Face `tokenizers` gives:
//   1. added tokens are cut out of the text, leftmost-longest (those with
//      normalized=false from the raw text, then the others from the normalized
//      pieces); special ones only when SpecialTokens::recognized;
//   2. each remaining piece is normalized (NFC or nothing);
//   3. pre-tokenized: Split steps (PCRE2 regex, any behavior, invert), then
//      ByteLevel (optional prefix space, optional GPT-2 regex);
//   4. each word is BPE-merged over its bytes (merge-list rank order, Hugging
//      Face's stale-merge rule; ignore_merges takes a whole word found in the vocab).
// The subset of tokenizer.json read is listed in hf_tokenizer_json.hpp.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "shardlm/data/added_tokens.hpp"
#include "shardlm/data/bpe.hpp"
#include "shardlm/data/hf_tokenizer_json.hpp"
#include "shardlm/data/pcre2_regex.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

class HfTokenizer final : public Tokenizer {
 public:
  // Loads dir/tokenizer.json (and reads eos_token from dir/tokenizer_config.json
  // when present). `expected_sha256`, when not empty, must equal
  // hf_tokenizer_files_sha256(dir), else Error.
  explicit HfTokenizer(const std::string& dir, const std::string& expected_sha256 = "");
  ~HfTokenizer() override;

  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }
  std::string spec() const override;
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }
  std::optional<int32_t> special_token_id(std::string_view text) const override;
  std::string normalize(std::string_view text) const override;
  Frame frame() const override { return frame_; }

 protected:
  std::vector<int32_t> encode_text(std::string_view text, SpecialTokens specials) const override;

 private:
  struct SplitStep;
  void build_vocabulary(const HfTokenizerJson& file, const std::string& path);
  void build_merges(const HfTokenizerJson& file, const std::string& path);
  void encode_normalized_piece(std::string_view piece, SpecialTokens specials, std::vector<int32_t>& ids) const;
  void encode_pre_tokenized(std::string_view piece, std::vector<int32_t>& ids) const;

  std::string dir_;  // absolute
  std::string sha256_;
  std::vector<std::string> token_bytes_;  // id -> bytes a decode gives (empty: no such id)
  IdOfBytes id_of_bytes_;                 // model.vocab
  BpeWordEncoder words_;                  // whole words: id_of_bytes_ when ignore_merges
  bool nfc_ = false;
  std::vector<std::unique_ptr<SplitStep>> splits_;
  bool add_prefix_space_ = false;
  std::unique_ptr<Pcre2Regex> byte_level_regex_;  // null: ByteLevel without use_regex
  AddedTokenMatcher raw_added_;         // added tokens with normalized = false
  AddedTokenMatcher normalized_added_;  // the others, by their normalized text
  std::unordered_set<int32_t> special_ids_;
  std::unordered_map<std::string, int32_t> added_id_of_text_;
  std::optional<int32_t> end_of_text_;
  Frame frame_;
};

// SHA-256 (hex) of DIR/tokenizer.json's bytes followed by DIR/tokenizer_config.json's
// (when present): `cat tokenizer.json tokenizer_config.json | sha256sum`.
std::string hf_tokenizer_files_sha256(const std::string& dir);

}  // namespace shardlm
