#include "shardlm/data/prepare.hpp"

#include <cmath>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/data/tokenizer.hpp"

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

  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  SHARDLM_CHECK(!ec && std::filesystem::is_directory(options.out_dir),
                "prepare: cannot create output directory {}: {}", options.out_dir,
                ec ? ec.message() : "a file with that name exists");

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
  const std::string meta_text = meta_to_json(meta).dump(2) + "\n";
  AtomicFileWriter meta_file(summary.meta_path);
  meta_file.write(meta_text.data(), meta_text.size());
  meta_file.finish();
  // meta.json goes last: a reader that finds it finds the token files it describes.
  train.commit();
  val.commit();
  meta_file.commit();

  summary.meta = std::move(meta);
  summary.seconds = stopwatch.seconds();
  return summary;
}

DatasetMeta read_dataset_meta(const std::string& dir) {
  const std::string path = dataset_meta_path(dir);
  const std::string text = read_text_file(path, "meta.json written by `shardlm prepare`");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("{} is not valid JSON at byte {} (expected meta.json written by `shardlm prepare`)",
                            path, e.byte));
  }
  SHARDLM_CHECK(json.is_object(), "{} is not a JSON object (expected meta.json written by `shardlm prepare`)", path);
  auto field = [&](const char* name, auto is_type, const char* expected) -> const nlohmann::json& {
    SHARDLM_CHECK(json.contains(name), "{}: missing field \"{}\" (expected {})", path, name, expected);
    const nlohmann::json& value = json.at(name);
    SHARDLM_CHECK(is_type(value), "{}: field \"{}\" is {} (expected {})", path, name, value.dump(), expected);
    return value;
  };
  const auto is_count = [](const nlohmann::json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; };
  DatasetMeta meta;
  meta.format_version = field("format_version", is_count, "an integer").get<int>();
  SHARDLM_CHECK(meta.format_version >= 1 && meta.format_version <= kDatasetFormatVersion,
                "{}: format_version {} (this build reads versions 1..{}; a newer shardlm wrote it)", path,
                meta.format_version, kDatasetFormatVersion);
  meta.tokenizer = field("tokenizer", [](const nlohmann::json& v) { return v.is_string(); }, "a tokenizer spec string")
                       .get<std::string>();
  meta.vocab_size = field("vocab_size", is_count, "a positive integer").get<int64_t>();
  SHARDLM_CHECK(meta.vocab_size > 0, "{}: vocab_size is 0 (expected a positive integer)", path);
  const nlohmann::json& eot =
      field("end_of_text", [](const nlohmann::json& v) { return v.is_null() || v.is_number_integer(); },
            "a token id or null");
  if (!eot.is_null()) meta.end_of_text = eot.get<int32_t>();
  meta.train_tokens = field("train_tokens", is_count, "a token count").get<int64_t>();
  meta.val_tokens = field("val_tokens", is_count, "a token count").get<int64_t>();
  meta.val_fraction = field("val_fraction", [](const nlohmann::json& v) { return v.is_number(); }, "a number")
                          .get<double>();
  const nlohmann::json& sources =
      field("sources", [](const nlohmann::json& v) { return v.is_array(); }, "an array of source files");
  for (const nlohmann::json& source : sources) {
    SHARDLM_CHECK(source.is_object() && source.contains("path") && source["path"].is_string() &&
                      source.contains("bytes") && is_count(source["bytes"]) && source.contains("sha256") &&
                      source["sha256"].is_string() && source.contains("tokens") && is_count(source["tokens"]),
                  "{}: source entry {} (expected {{\"path\", \"bytes\", \"sha256\", \"tokens\"}})", path,
                  source.dump());
    meta.sources.push_back({source["path"].get<std::string>(), source["bytes"].get<int64_t>(),
                            source["sha256"].get<std::string>(), source["tokens"].get<int64_t>()});
  }
  return meta;
}

}  // namespace shardlm
