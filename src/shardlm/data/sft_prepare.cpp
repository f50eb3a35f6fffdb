#include "shardlm/data/sft_prepare.hpp"

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/data/chat_template.hpp"
#include "shardlm/data/dataset_meta_json.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sft_example_file.hpp"
#include "shardlm/data/token_file.hpp"

namespace shardlm {
namespace {

ChatTemplateOptions chat_template_options(const SftPrepareOptions& options) {
  ChatTemplateOptions out;
  out.enable_thinking = options.enable_thinking;
  out.date = options.template_date;
  return out;
}

// A meta.json chat_template: a built-in's name or "sha256:" and 64 hex digits,
// then ",enable_thinking=true|false" when it was set.
bool valid_chat_template_id(const std::string& id) {
  std::string base = id;
  for (const char* suffix : {",enable_thinking=true", ",enable_thinking=false"}) {
    const std::string tail(suffix);
    if (base.size() > tail.size() && base.compare(base.size() - tail.size(), tail.size(), tail) == 0)
      base.resize(base.size() - tail.size());
  }
  if (base.rfind("sha256:", 0) == 0)
    return base.size() == 7 + 64 && base.find_first_not_of("0123456789abcdef", 7) == std::string::npos;
  try {
    parse_chat_template(base);
    return true;
  } catch (const Error&) {
    return false;
  }
}

struct SplitBuilder {
  SftExamples examples;
  SftSplitCounts counts;
};

// Tokenizes one file's conversations into `split`; truncation and dropping counted in meta.
void add_file(const std::string& path, const Tokenizer& tokenizer, const ChatFormat& chat_template,
              const SftPrepareOptions& options, SplitBuilder& split, SftDatasetMeta& meta, const std::string& split_name) {
  const std::vector<Conversation> conversations = read_chat_dataset(path);
  SftSourceInfo source;
  source.path = std::filesystem::absolute(path).lexically_normal().string();
  source.bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  source.sha256 = sha256_file_hex(path);
  source.examples = static_cast<int64_t>(conversations.size());
  source.split = split_name;
  meta.sources.push_back(std::move(source));
  // --no-truncate: the first over-long example, how many there are and the longest, so
  // that the error names the --max-len that would take them all.
  struct OverLong {
    int64_t count = 0, first_example = 0, first_line = 0, first_tokens = 0, longest = 0, longest_line = 0;
  } over;
  int64_t example = 0;
  for (const Conversation& conversation : conversations) {
    ++example;
    TokenizedChat chat = tokenize_chat(tokenizer, chat_template, conversation);
    bool truncated = false;
    const int64_t tokens = static_cast<int64_t>(chat.ids.size());
    if (options.max_len > 0 && tokens > options.max_len && !options.truncate) {
      if (over.count++ == 0) over.first_example = example, over.first_line = conversation.line, over.first_tokens = tokens;
      if (tokens > over.longest) over.longest = tokens, over.longest_line = conversation.line;
      continue;
    }
    if (options.max_len > 0 && tokens > options.max_len) {
      chat.ids.resize(static_cast<size_t>(options.max_len));
      chat.targets.resize(static_cast<size_t>(options.max_len));
      truncated = true;
    }
    // The first token is never predicted (nothing comes before it in the example);
    // every template starts with a header anyway.
    if (!chat.targets.empty()) chat.targets[0] = 0;
    int64_t targets = 0;
    for (uint8_t t : chat.targets) targets += t;
    if (targets == 0) {
      ++meta.dropped_examples;
      continue;
    }
    meta.truncated_examples += truncated;
    split.examples.add(chat.ids, chat.targets);
    split.counts.examples += 1;
    split.counts.tokens += static_cast<int64_t>(chat.ids.size());
    split.counts.target_tokens += targets;
  }
  SHARDLM_CHECK(over.count == 0,
                "{} line {} (example {}): the conversation has {} tokens, more than --max-len {} (the "
                "sequence length), and --no-truncate does not cut it; {} of the file's {} examples are "
                "longer, the longest {} tokens (line {}): raise --max-len to {} (ms-swift: --max_length), "
                "or leave out --no-truncate to cut them to {} tokens",
                path, over.first_line, over.first_example, over.first_tokens, options.max_len, over.count,
                conversations.size(), over.longest, over.longest_line, over.longest, options.max_len);
}

// The last `count` examples of `from` move to the empty `to` (in order).
void move_last_examples(SplitBuilder& from, int64_t count, SplitBuilder& to) {
  SHARDLM_ASSERT(to.counts.examples == 0 && count <= from.counts.examples);
  const int64_t first = from.examples.size() - count;
  for (int64_t e = first; e < from.examples.size(); ++e) {
    const int64_t begin = from.examples.offsets[e], end = from.examples.offsets[e + 1];
    const std::span<const int32_t> ids(from.examples.tokens.data() + begin, static_cast<size_t>(end - begin));
    const std::span<const uint8_t> mask(from.examples.mask.data() + begin, static_cast<size_t>(end - begin));
    to.examples.add(ids, mask);
    to.counts.examples += 1;
    to.counts.tokens += end - begin;
    for (uint8_t m : mask) to.counts.target_tokens += m;
  }
  const int64_t cut = from.examples.offsets[first];
  from.counts.examples -= count;
  from.counts.tokens -= to.counts.tokens;
  from.counts.target_tokens -= to.counts.target_tokens;
  from.examples.offsets.resize(static_cast<size_t>(first) + 1);
  from.examples.tokens.resize(static_cast<size_t>(cut));
  from.examples.mask.resize(static_cast<size_t>(cut));
}

nlohmann::json meta_to_json(const SftDatasetMeta& meta) {
  nlohmann::json sources = nlohmann::json::array();
  for (const SftSourceInfo& s : meta.sources)
    sources.push_back({{"path", s.path}, {"bytes", s.bytes}, {"sha256", s.sha256}, {"examples", s.examples},
                       {"split", s.split}});
  auto optional = [](const auto& value) { return value ? nlohmann::json(*value) : nlohmann::json(nullptr); };
  return {
      {"format_version", meta.format_version},
      {"kind", "sft"},
      {"tokenizer", meta.tokenizer},
      {"vocab_size", meta.vocab_size},
      {"end_of_text", optional(meta.end_of_text)},
      {"chat_template", meta.chat_template},
      {"chat_template_origin", meta.chat_template_origin},
      {"token_dtype", token_bytes_for_vocab(meta.vocab_size) == 2 ? "uint16" : "uint32"},
      {"train_file", "train.sft"},
      {"val_file", "val.sft"},
      {"train_examples", meta.train.examples},
      {"val_examples", meta.val.examples},
      {"train_tokens", meta.train.tokens},
      {"val_tokens", meta.val.tokens},
      {"train_target_tokens", meta.train.target_tokens},
      {"val_target_tokens", meta.val.target_tokens},
      {"max_len", optional(meta.max_len)},
      {"truncated_examples", meta.truncated_examples},
      {"dropped_examples", meta.dropped_examples},
      {"val_fraction", optional(meta.val_fraction)},
      {"sources", sources},
  };
}

}  // namespace

std::string sft_train_path(const std::string& dir) { return (std::filesystem::path(dir) / "train.sft").string(); }
std::string sft_val_path(const std::string& dir) { return (std::filesystem::path(dir) / "val.sft").string(); }

SftPrepareSummary prepare_sft_dataset(const SftPrepareOptions& options) {
  Stopwatch stopwatch;
  SHARDLM_CHECK(!options.inputs.empty(), "prepare --sft: no input files (expected at least one JSONL dataset)");
  SHARDLM_CHECK(!options.out_dir.empty(), "prepare --sft: no output directory given");
  SHARDLM_CHECK(std::isfinite(options.val_fraction) && options.val_fraction >= 0.0 && options.val_fraction < 1.0,
                "prepare --sft: val fraction {} (expected a number in [0, 1))", options.val_fraction);
  SHARDLM_CHECK(options.val_inputs.empty() || options.val_fraction == 0.0,
                "prepare --sft: --val-input and a val fraction {} both given (expected one way to make val.sft)",
                options.val_fraction);
  SHARDLM_CHECK(options.max_len >= 0, "prepare --sft: --max-len {} (expected a positive token count, or 0 for no "
                "limit)", options.max_len);
  SHARDLM_CHECK(options.truncate || options.max_len > 0, "prepare --sft: --no-truncate needs --max-len");
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  const ChatFormat chat_template = resolve_chat_format(options.chat_template, *tokenizer,
                                                      chat_template_options(options));

  SftDatasetMeta meta;
  meta.format_version = kSftDatasetFormatVersion;
  meta.tokenizer = tokenizer->spec();
  meta.vocab_size = tokenizer->vocab_size();
  meta.end_of_text = tokenizer->end_of_text();
  meta.chat_template = chat_template.id();
  meta.chat_template_origin = chat_template.origin();
  if (options.max_len > 0) meta.max_len = options.max_len;
  SplitBuilder train, val;
  for (const std::string& input : options.inputs)
    add_file(input, *tokenizer, chat_template, options, train, meta, "train");
  for (const std::string& input : options.val_inputs)
    add_file(input, *tokenizer, chat_template, options, val, meta, "val");
  if (options.val_inputs.empty()) {
    meta.val_fraction = options.val_fraction;
    move_last_examples(train, static_cast<int64_t>(std::floor(static_cast<double>(train.counts.examples) *
                                                               options.val_fraction)), val);
  }
  SHARDLM_CHECK(train.counts.examples > 0, "prepare --sft: no training example left ({} dropped after --max-len {} "
                "cut away every target)", meta.dropped_examples, options.max_len);
  meta.train = train.counts;
  meta.val = val.counts;

  create_dataset_directory(options.out_dir, "prepare --sft");
  SftPrepareSummary summary;
  summary.train_path = sft_train_path(options.out_dir);
  summary.val_path = sft_val_path(options.out_dir);
  summary.meta_path = dataset_meta_path(options.out_dir);
  SftExampleFileWriter train_file(summary.train_path, meta.vocab_size, train.examples);
  SftExampleFileWriter val_file(summary.val_path, meta.vocab_size, val.examples);
  commit_dataset(summary.meta_path, meta_to_json(meta).dump(2) + "\n", train_file, val_file);
  summary.meta = std::move(meta);
  summary.seconds = stopwatch.seconds();
  return summary;
}

std::string sft_chat_template_id(const SftPrepareOptions& options) {
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  return resolve_chat_format(options.chat_template, *tokenizer, chat_template_options(options)).id();
}

bool is_sft_dataset(const std::string& dir) {
  if (!std::filesystem::exists(dataset_meta_path(dir))) return false;
  return DatasetMetaJson(dir).kind() == "sft";
}

SftDatasetMeta read_sft_dataset_meta(const std::string& dir) {
  const DatasetMetaJson json(dir);
  SHARDLM_CHECK(json.kind() == "sft", "{} describes a text dataset (expected one written by `shardlm prepare --sft`)",
                json.path());
  SftDatasetMeta meta;
  meta.format_version = json.format_version(kSftDatasetFormatVersion);
  meta.tokenizer = json.tokenizer();
  meta.vocab_size = json.vocab_size();
  meta.end_of_text = json.end_of_text();
  meta.chat_template = json.string("chat_template");
  SHARDLM_CHECK(valid_chat_template_id(meta.chat_template), "{}: chat_template '{}' (expected chatml, llama3, plain, "
                "qwen3 or sha256:HEX, optionally with ,enable_thinking=true|false)", json.path(), meta.chat_template);
  meta.train = {json.count("train_examples"), json.count("train_tokens"), json.count("train_target_tokens")};
  meta.val = {json.count("val_examples"), json.count("val_tokens"), json.count("val_target_tokens")};
  if (const std::optional<double> max_len = json.optional_number("max_len")) meta.max_len = static_cast<int64_t>(*max_len);
  meta.truncated_examples = json.count("truncated_examples");
  meta.dropped_examples = json.count("dropped_examples");
  meta.val_fraction = json.optional_number("val_fraction");
  for (const nlohmann::json& s : json.array("sources")) {
    SHARDLM_CHECK(s.is_object() && s.value("path", nlohmann::json()).is_string() &&
                      s.value("bytes", nlohmann::json()).is_number_integer() &&
                      s.value("sha256", nlohmann::json()).is_string() &&
                      s.value("examples", nlohmann::json()).is_number_integer() &&
                      s.value("split", nlohmann::json()).is_string(),
                  "{}: source entry {} (expected {{\"path\", \"bytes\", \"sha256\", \"examples\", \"split\"}})",
                  json.path(), s.dump());
    meta.sources.push_back({s["path"], s["bytes"], s["sha256"], s["examples"], s["split"]});
  }
  return meta;
}

}  // namespace shardlm
