// Tokenizer: text <-> token ids. Implementations (make_tokenizer specs):
//   "byte"                 ids are the bytes
//   "gpt2:DIR"             GPT-2 byte-level BPE from DIR/vocab.json and DIR/merges.txt
//   "hf:DIR"               a Hugging Face tokenizer.json (byte-level BPE) in DIR
//   "tiktoken:PRESET:FILE" a tiktoken rank file with a preset's regex and special
//                          tokens (PRESET: qwen; "tiktoken:FILE" means qwen)
// hf and tiktoken specs carry the SHA-256 of the files they were built from
// ("hf:/abs/dir#sha256=HEX"): loading such a spec fails when the files changed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

// Whether special-token text such as "<|im_end|>" inside the text to encode is
// the special token or ordinary text.
enum class SpecialTokens {
  as_text,     // ordinary text (tiktoken's encode_ordinary; tokenizers with
               // encode_special_tokens=True): data cannot inject control tokens
  recognized,  // the special token (Hugging Face tokenizers' default, tiktoken's
               // allowed_special="all"), as chat templates need
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Any bytes are accepted (byte-level tokenizers never fail on input).
  // decode(encode(x)) == normalize(x) for every x. Non-special added tokens of a
  // tokenizer.json are always matched (they are vocabulary); special ones only
  // when `specials` is recognized. No BOS/EOS is added: see frame().
  std::vector<int32_t> encode(std::string_view text, SpecialTokens specials = SpecialTokens::as_text) const {
    return encode_text(text, specials);
  }
  // Returns the raw bytes of the tokens (not necessarily valid UTF-8 when the
  // ids cut a character). Throws Error for an id outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // One more than the largest id.
  virtual int vocab_size() const = 0;
  // The spec that recreates this tokenizer with make_tokenizer() (absolute paths;
  // with the files' SHA-256 for hf and tiktoken).
  virtual std::string spec() const = 0;
  // The id that separates documents, when the vocabulary has one.
  virtual std::optional<int32_t> end_of_text() const = 0;

  // The id of an added/special token given by its text ("<|im_end|>"), if any.
  virtual std::optional<int32_t> special_token_id(std::string_view text) const = 0;
  // What the tokenizer applies to text before splitting it (NFC for Qwen2); the
  // identity for most. decode(encode(x)) == normalize(x).
  virtual std::string normalize(std::string_view text) const { return std::string(text); }

  // The ids a tokenizer.json post-processor puts around one sequence (Llama 3:
  // prefix = {<|begin_of_text|>}), i.e. what Hugging Face's encode adds with
  // add_special_tokens=True.
  struct Frame {
    std::vector<int32_t> prefix;
    std::vector<int32_t> suffix;
  };
  virtual Frame frame() const { return {}; }

 protected:
  virtual std::vector<int32_t> encode_text(std::string_view text, SpecialTokens specials) const = 0;
};

// spec: see the top of this file; a plain directory holding tokenizer.json means
// "hf:DIR". Throws Error for an unknown spec, for tokenizer files that are
// missing, unreadable or malformed (naming the file and what was expected), and
// for files whose SHA-256 differs from the one in the spec.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// A spec taken apart. kind: "byte", "gpt2", "hf" or "tiktoken"; path: the
// directory (gpt2, hf) or rank file (tiktoken); preset: tiktoken's; sha256: empty
// when the spec carries none.
struct TokenizerSpec {
  std::string kind;
  std::string path;
  std::string preset;
  std::string sha256;
};
// Error for a spec make_tokenizer() would not accept by its form (files are not read).
TokenizerSpec parse_tokenizer_spec(const std::string& spec);

}  // namespace shardlm
