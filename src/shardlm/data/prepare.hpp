// `shardlm prepare`: tokenizes text files into DIR/train.bin, DIR/val.bin and
// DIR/meta.json (format: docs/data-format.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardlm/core/file_util.hpp"

namespace shardlm {

struct PrepareOptions {
  std::string tokenizer = "byte";   // a make_tokenizer() spec (tokenizer.hpp)
  std::vector<std::string> inputs;  // text files, concatenated in this order
  std::string out_dir;              // created if missing
  double val_fraction = 0.1;        // the last fraction of the token stream, in [0, 1)
};

struct SourceFileInfo {
  std::string path;  // absolute
  int64_t bytes = 0;
  std::string sha256;
  int64_t tokens = 0;  // tokens of this file alone (with the tokenizer's BOS/EOS frame, no end-of-text)
};

// What meta.json records.
struct DatasetMeta {
  int format_version = 0;
  std::string tokenizer;  // spec that recreates the tokenizer
  int64_t vocab_size = 0;
  std::optional<int32_t> end_of_text;  // inserted between input files when present
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  double val_fraction = 0.0;
  std::vector<SourceFileInfo> sources;
};

struct PrepareSummary {
  DatasetMeta meta;
  std::string train_path;
  std::string val_path;
  std::string meta_path;
  double seconds = 0.0;  // wall time of the whole prepare
};

inline constexpr int kDatasetFormatVersion = 1;

std::string dataset_train_path(const std::string& dir);  // DIR/train.bin
std::string dataset_val_path(const std::string& dir);    // DIR/val.bin
std::string dataset_meta_path(const std::string& dir);   // DIR/meta.json

// Tokenizes options.inputs in order (end-of-text between files when the
// tokenizer has one) and writes the split. Every output is written to a
// temporary file and renamed into place only after all three are complete, so
// a failure leaves the previous contents of out_dir as they were. Error (one
// line, naming the file or option) for a missing, unreadable or empty input,
// no inputs, a val fraction outside [0, 1), a bad tokenizer spec, or I/O failure.
PrepareSummary prepare_dataset(const PrepareOptions& options);

// Creates a dataset's output directory; Error naming it (and `command`) when impossible.
void create_dataset_directory(const std::string& out_dir, std::string_view command);

// Writes meta.json's text to a temporary file, then renames every finished data
// file writer (commit()) into place and meta.json last: a reader that finds
// meta.json finds the files it describes.
template <typename... DataFiles>
void commit_dataset(const std::string& meta_path, const std::string& meta_text, DataFiles&... data_files) {
  AtomicFileWriter meta_file(meta_path);
  meta_file.write(meta_text.data(), meta_text.size());
  meta_file.finish();
  (data_files.commit(), ...);
  meta_file.commit();
}

// Reads and validates DIR/meta.json; Error naming the file and the field.
DatasetMeta read_dataset_meta(const std::string& dir);

}  // namespace shardlm
