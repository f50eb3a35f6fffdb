// Reading a Hugging Face tokenizer.json: the subset shardlm implements, checked
// strictly. Everything that changes the ids and is not implemented is refused by
// name, never ignored:
//   model            BPE (vocab + merges, "a b" strings or [a, b] pairs; ignore_merges;
//                    no dropout, byte_fallback, subword prefix or word suffix)
//   normalizer       null, NFC, or a Sequence of those
//   pre_tokenizer    ByteLevel, Split (Regex or String pattern, any behavior, invert),
//                    or a Sequence of Splits ending in ByteLevel
//   post_processor   null, ByteLevel, TemplateProcessing, or a Sequence of those
//   decoder          null or ByteLevel
//   added_tokens     special or not, normalized or not (no lstrip/rstrip/single_word)
//   truncation, padding: null
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardlm {

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct HfPreTokenizerStep {
  enum class Kind { split, byte_level };
  Kind kind = Kind::split;
  // split: a PCRE2 pattern (a String pattern arrives escaped), behavior, invert.
  std::string pattern;
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  // byte_level: add_prefix_space (a space before every piece that does not start
  // with one) and use_regex (GPT-2's pattern, Isolated).
  bool add_prefix_space = false;
  bool use_regex = true;
};

struct HfAddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;  // matched in normalized text (else in the raw text)
};

struct HfTokenizerJson {
  std::vector<std::pair<std::string, int32_t>> vocab;          // token text (byte-level alphabet), id
  std::vector<std::pair<std::string, std::string>> merges;     // in rank order
  bool ignore_merges = false;  // a word that is itself a token is not merged
  bool nfc = false;            // the normalizer is NFC
  std::vector<HfPreTokenizerStep> pre_tokenizer;  // ByteLevel is last, or absent
  std::vector<HfAddedToken> added_tokens;
  std::vector<int32_t> prefix_ids;  // TemplateProcessing's single-sequence ids before $A
  std::vector<int32_t> suffix_ids;  // and after it
};

// Error (one line, naming the file, the field and the value) for a missing or
// unreadable file, malformed JSON and anything outside the subset above.
HfTokenizerJson read_hf_tokenizer_json(const std::string& path);

}  // namespace shardlm
