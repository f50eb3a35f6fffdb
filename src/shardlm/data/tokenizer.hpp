// Tokenizer: text <-> token ids. Implementations: "byte" (ids are the bytes) and
// "gpt2:DIR" (GPT-2 byte-level BPE from DIR/vocab.json and DIR/merges.txt).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Any bytes are accepted (byte-level tokenizers never fail on input);
  // decode(encode(x)) == x for every x. Special-token text such as
  // "<|endoftext|>" inside `text` is encoded as ordinary text: end-of-text ids
  // come only from the caller (as in OpenAI's encoder.py and tiktoken's
  // encode_ordinary), so data cannot inject control tokens.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Returns the raw bytes of the tokens (not necessarily valid UTF-8 when the
  // ids cut a character). Throws Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
  // The spec that recreates this tokenizer with make_tokenizer(): "byte" or
  // "gpt2:/absolute/dir".
  virtual std::string spec() const = 0;
  // The id that separates documents, when the vocabulary has one.
  virtual std::optional<int32_t> end_of_text() const = 0;
};

// spec: "byte" or "gpt2:DIR". Throws Error for an unknown spec or for tokenizer
// files that are missing, unreadable or malformed (naming the file and what was
// expected).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

}  // namespace shardlm
