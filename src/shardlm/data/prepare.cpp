#include "shardlm/data/prepare.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/data/dataset_meta_json.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/data/utf8.hpp"

namespace shardlm {
namespace {

std::string read_input(const std::string& path) {
  std::error_code ec;
  SHARDLM_CHECK(std::filesystem::exists(path, ec), "input file {} does not exist (expected a text file)", path);
  SHARDLM_CHECK(std::filesystem::is_regular_file(path, ec), "input file {} is not a regular file (expected a text file)",
                path);
  std::string text = read_text_file(path, "a readable text file");
  SHARDLM_CHECK(!text.empty(), "input file {} is empty (expected text to tokenize)", path);
  return text;
}

nlohmann::json meta_to_json(const DatasetMeta& meta) {
  nlohmann::json sources = nlohmann::json::array();
  for (const SourceFileInfo& source : meta.sources)
    sources.push_back(
        {{"path", source.path}, {"bytes", source.bytes}, {"sha256", source.sha256}, {"tokens", source.tokens}});
  return {
      {"format_version", meta.format_version},
      {"tokenizer", meta.tokenizer},
      {"vocab_size", meta.vocab_size},
      {"end_of_text", meta.end_of_text ? nlohmann::json(*meta.end_of_text) : nlohmann::json(nullptr)},
      {"token_dtype", token_bytes_for_vocab(meta.vocab_size) == 2 ? "uint16" : "uint32"},
      {"train_file", "train.bin"},
      {"val_file", "val.bin"},
      {"train_tokens", meta.train_tokens},
      {"val_tokens", meta.val_tokens},
      {"val_fraction", meta.val_fraction},
      {"sources", sources},
  };
}

}  // namespace

std::string dataset_train_path(const std::string& dir) { return (std::filesystem::path(dir) / "train.bin").string(); }
std::string dataset_val_path(const std::string& dir) { return (std::filesystem::path(dir) / "val.bin").string(); }
std::string dataset_meta_path(const std::string& dir) { return (std::filesystem::path(dir) / "meta.json").string(); }

void create_dataset_directory(const std::string& out_dir, std::string_view command) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  SHARDLM_CHECK(!ec && std::filesystem::is_directory(out_dir), "{}: cannot create output directory {}: {}", command,
                out_dir, ec ? ec.message() : "a file with that name exists");
}

PrepareSummary prepare_dataset(const PrepareOptions& options) {
  Stopwatch stopwatch;
  SHARDLM_CHECK(!options.inputs.empty(), "prepare: no input files (expected at least one text file)");
  SHARDLM_CHECK(!options.out_dir.empty(), "prepare: no output directory given");
  SHARDLM_CHECK(std::isfinite(options.val_fraction) && options.val_fraction >= 0.0 && options.val_fraction < 1.0,
                "prepare: val fraction {} (expected a number in [0, 1))", options.val_fraction);
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);

  DatasetMeta meta;
  meta.format_version = kDatasetFormatVersion;
  meta.tokenizer = tokenizer->spec();
  meta.vocab_size = tokenizer->vocab_size();
  meta.end_of_text = tokenizer->end_of_text();
  meta.val_fraction = options.val_fraction;

  const Tokenizer::Frame frame = tokenizer->frame();
  // Inputs are all read (and checked) before the output directory is touched.
  std::vector<int32_t> stream;
  for (size_t i = 0; i < options.inputs.size(); ++i) {
    const std::string& input = options.inputs[i];
    const std::string text = read_input(input);
    // Binary input tokenizes without an error (every tokenizer takes bytes): say so.
    if (const auto bad = utf8::find_invalid(text))
      std::fprintf(stderr,
                   "warning: %s is not valid UTF-8 text (first invalid byte at offset %zu, %zu invalid "
                   "in all): is it the text you meant to prepare?\n",
                   input.c_str(), bad->first_offset, bad->count);
    // Special-token text in the data stays text; a tokenizer.json post-processor's
    // BOS/EOS (Llama 3: <|begin_of_text|>) frame each file, as Hugging Face's encode does.
    std::vector<int32_t> ids = frame.prefix;
    const std::vector<int32_t> body = tokenizer->encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    ids.insert(ids.end(), frame.suffix.begin(), frame.suffix.end());
    SourceFileInfo source;
    source.path = std::filesystem::absolute(input).lexically_normal().string();
    source.bytes = static_cast<int64_t>(text.size());
    source.sha256 = sha256_hex(text.data(), text.size());
    source.tokens = static_cast<int64_t>(ids.size());
    meta.sources.push_back(std::move(source));
    if (i > 0 && meta.end_of_text) stream.push_back(*meta.end_of_text);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  const auto total = static_cast<int64_t>(stream.size());
  meta.val_tokens = static_cast<int64_t>(std::floor(static_cast<double>(total) * options.val_fraction));
  meta.train_tokens = total - meta.val_tokens;

  create_dataset_directory(options.out_dir, "prepare");

  PrepareSummary summary;
  summary.train_path = dataset_train_path(options.out_dir);
  summary.val_path = dataset_val_path(options.out_dir);
  summary.meta_path = dataset_meta_path(options.out_dir);
  const std::span<const int32_t> all(stream);
  TokenFileWriter train(summary.train_path, meta.vocab_size);
  train.append(all.first(static_cast<size_t>(meta.train_tokens)));
  train.finish();
  TokenFileWriter val(summary.val_path, meta.vocab_size);
  val.append(all.subspan(static_cast<size_t>(meta.train_tokens)));
  val.finish();
  commit_dataset(summary.meta_path, meta_to_json(meta).dump(2) + "\n", train, val);

  summary.meta = std::move(meta);
  summary.seconds = stopwatch.seconds();
  return summary;
}

DatasetMeta read_dataset_meta(const std::string& dir) {
  const DatasetMetaJson json(dir);
  SHARDLM_CHECK(json.kind() == "text", "{} describes an SFT dataset (written by `shardlm prepare --sft`; expected a "
                "text dataset here)", json.path());
  DatasetMeta meta;
  meta.format_version = json.format_version(kDatasetFormatVersion);
  meta.tokenizer = json.tokenizer();
  meta.vocab_size = json.vocab_size();
  meta.end_of_text = json.end_of_text();
  meta.train_tokens = json.count("train_tokens");
  meta.val_tokens = json.count("val_tokens");
  meta.val_fraction = json.field("val_fraction", [](const nlohmann::json& v) { return v.is_number(); }, "a number")
                          .get<double>();
  const auto is_count = [](const nlohmann::json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; };
  for (const nlohmann::json& source : json.array("sources")) {
    SHARDLM_CHECK(source.is_object() && source.contains("path") && source["path"].is_string() &&
                      source.contains("bytes") && is_count(source["bytes"]) && source.contains("sha256") &&
                      source["sha256"].is_string() && source.contains("tokens") && is_count(source["tokens"]),
                  "{}: source entry {} (expected {{\"path\", \"bytes\", \"sha256\", \"tokens\"}})", json.path(),
                  source.dump());
    meta.sources.push_back({source["path"].get<std::string>(), source["bytes"].get<int64_t>(),
                            source["sha256"].get<std::string>(), source["tokens"].get<int64_t>()});
  }
  return meta;
}

}  // namespace shardlm
