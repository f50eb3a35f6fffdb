// GPT-2 byte-level BPE, matching OpenAI's encoder.py / Hugging Face's GPT-2
// tokenizer id for id: regex pre-tokenization (gpt2_pretokenizer.hpp), bytes
// mapped through GPT-2's byte table, then merges applied lowest rank first.
#pragma once

#include <array>
#include <mutex>
#include <string>
#include <unordered_map>

#include "shardlm/data/gpt2_pretokenizer.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Loads dir/vocab.json and dir/merges.txt; Error naming the file and line on
  // anything missing or malformed.
  explicit Gpt2Tokenizer(const std::string& dir);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }
  std::string spec() const override { return "gpt2:" + dir_; }
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void load_vocab(const std::string& path);
  void load_merges(const std::string& path);
  // BPE of one pre-tokenized word, appended to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void apply_merges(std::string_view word, std::vector<int32_t>& out) const;

  std::string dir_;  // absolute
  std::vector<std::string> token_bytes_;  // id -> raw bytes
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> id_of_bytes_;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;  // pair_key(left, right) -> merge
  std::optional<int32_t> end_of_text_;
  gpt2::PreTokenizer pre_tokenizer_;

  // Words repeat a lot in text: remember each short word's ids. Bounded; cleared
  // when full.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace shardlm
