// `shardlm prepare --sft`: chat/instruction datasets (JSONL, chat_dataset.hpp)
// rendered with a chat template (chat_template.hpp), tokenized with their loss
// masks into DIR/train.sft, DIR/val.sft (sft_example_file.hpp) and DIR/meta.json
// (format: docs/data-format.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardlm {

struct SftPrepareOptions {
  std::string tokenizer;                // a make_tokenizer() spec
  std::string chat_template;            // resolve_chat_format's choice: empty (the tokenizer directory's
                                        // own, else a built-in), chatml, llama3, plain, qwen3, FILE.jinja
  std::optional<bool> enable_thinking;  // passed to the template when set (Qwen3)
  std::string template_date;            // strftime_now's day, YYYY-MM-DD; empty: today (UTC)
  std::vector<std::string> inputs;      // JSONL files, in order
  std::vector<std::string> val_inputs;  // JSONL files for val.sft; empty: the last val_fraction of the examples
  std::string out_dir;
  double val_fraction = 0.0;  // in [0, 1); must be 0 when val_inputs are given
  int64_t max_len = 0;        // > 0: examples longer than this many tokens are cut to it
  bool truncate = true;       // false: an example longer than max_len is an Error naming file and line
};

struct SftSourceInfo {
  std::string path;  // absolute
  int64_t bytes = 0;
  std::string sha256;
  int64_t examples = 0;  // lines read
  std::string split;     // "train" or "val": where its examples went ("train" for inputs split by fraction)
};

struct SftSplitCounts {
  int64_t examples = 0;
  int64_t tokens = 0;
  int64_t target_tokens = 0;
};

// What meta.json records ("kind": "sft").
struct SftDatasetMeta {
  int format_version = 0;
  std::string tokenizer;  // spec that recreates the tokenizer
  int64_t vocab_size = 0;
  std::optional<int32_t> end_of_text;
  std::string chat_template;  // ChatFormat::id(): a built-in's name or "sha256:HEX" of the template
  std::string chat_template_origin;  // where it came from (written, not read back)
  std::optional<int64_t> max_len;
  SftSplitCounts train;
  SftSplitCounts val;
  int64_t truncated_examples = 0;  // cut to max_len and kept
  int64_t dropped_examples = 0;    // cut to max_len with no target token left: left out
  std::optional<double> val_fraction;  // null when val came from val inputs
  std::vector<SftSourceInfo> sources;
};

struct SftPrepareSummary {
  SftDatasetMeta meta;
  std::string train_path;
  std::string val_path;
  std::string meta_path;
  double seconds = 0.0;
};

inline constexpr int kSftDatasetFormatVersion = 1;

std::string sft_train_path(const std::string& dir);  // DIR/train.sft
std::string sft_val_path(const std::string& dir);    // DIR/val.sft

// Reads, renders and tokenizes every input (all checked before anything is
// written), then writes the three files to temporaries and renames them into
// place together, meta.json last. Error (one line) for: no inputs, a missing or
// unreadable input, a malformed line (file and line), an unknown role, a
// conversation without an assistant turn, an empty dataset, an unknown template, a
// template the tokenizer cannot render, a bad val fraction, an example longer than
// max_len without truncation, no example left for train.
SftPrepareSummary prepare_sft_dataset(const SftPrepareOptions& options);

// The ChatFormat::id() prepare_sft_dataset would record for these options
// (what --resume compares with the dataset's meta.json).
std::string sft_chat_template_id(const SftPrepareOptions& options);

// Reads and validates DIR/meta.json of an SFT dataset; Error naming the file and
// the field, or saying the directory holds a text dataset.
SftDatasetMeta read_sft_dataset_meta(const std::string& dir);

// Whether DIR/meta.json says "kind": "sft" (false when there is no such file).
bool is_sft_dataset(const std::string& dir);

}  // namespace shardlm
