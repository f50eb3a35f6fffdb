#include "shardlm/train/batch_source.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "shardlm/core/error.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/data/sft_example_file.hpp"
#include "shardlm/data/sft_prepare.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/model/model.hpp"

namespace shardlm {

void fill_empty_row(const RowBuffers& out, int64_t at, int seq_len, bool positions) {
  const int64_t offset = at * seq_len;
  std::fill(out.tokens + offset, out.tokens + offset + seq_len, 0);
  std::fill(out.targets + offset, out.targets + offset + seq_len, kIgnoreIndex);
  if (positions) {
    for (int t = 0; t < seq_len; ++t) out.positions[offset + t] = t;
    std::fill(out.key_begin + offset, out.key_begin + offset + seq_len, 0);
  }
}

namespace {

// A text dataset: shuffled windows of seq_len + 1 tokens, every position a target.
class TokenWindowSource final : public BatchSource {
 public:
  TokenWindowSource(const std::string& dir, const BatchSourceOptions& options)
      : BatchSource(options.seq_len),
        meta_(read_dataset_meta(dir)),
        train_(dataset_train_path(dir)),
        val_(dataset_val_path(dir)),
        train_sampler_(train_, options.seq_len, options.seed) {
    SHARDLM_CHECK(!options.packing,
                  "--packing applies to chat datasets (`prepare --sft`); '{}' holds token windows "
                  "of text, which never cross an example boundary to begin with",
                  dir);
    if (val_.size() > options.seq_len) val_sampler_.emplace(val_, options.seq_len);
  }
  const DatasetMeta& meta() const override { return meta_; }
  bool has_positions() const override { return false; }
  void fill_train(int64_t first_row, int count, const RowBuffers& out) override {
    train_sampler_.fill_batch(first_row, count, out.tokens, out.targets);
  }
  int64_t train_rows_in_epochs(int64_t epochs) override { return epochs * train_sampler_.num_windows(); }
  int64_t val_rows() const override { return val_sampler_ ? val_sampler_->num_windows() : 0; }
  void fill_val(int64_t row, const RowBuffers& out, int64_t at) override {
    val_sampler_->fill(row, out.tokens + at * seq_len_, out.targets + at * seq_len_);
  }
  std::string describe() const override {
    return fmt::format("{} train / {} val tokens", train_.size(), val_.size());
  }
  nlohmann::json agreement() const override {
    return {{"train_tokens", train_.size()}, {"val_tokens", val_.size()}};
  }

 private:
  DatasetMeta meta_;
  TokenFile train_, val_;
  BatchSampler train_sampler_;
  std::optional<EvalSampler> val_sampler_;
};

DatasetMeta as_dataset_meta(const SftDatasetMeta& sft) {
  DatasetMeta meta;
  meta.format_version = sft.format_version;
  meta.tokenizer = sft.tokenizer;
  meta.vocab_size = sft.vocab_size;
  meta.end_of_text = sft.end_of_text;
  meta.train_tokens = sft.train.tokens;
  meta.val_tokens = sft.val.tokens;
  for (const SftSourceInfo& s : sft.sources) meta.sources.push_back({s.path, s.bytes, s.sha256, 0});
  return meta;
}

// An SFT dataset: one example per row (padded) or whole examples packed into rows;
// targets only where the loss mask says so.
class SftRowSource final : public BatchSource {
 public:
  SftRowSource(const std::string& dir, const BatchSourceOptions& options)
      : BatchSource(options.seq_len),
        sft_meta_(read_sft_dataset_meta(dir)),
        meta_(as_dataset_meta(sft_meta_)),
        train_(sft_train_path(dir)),
        val_(sft_val_path(dir)) {
    SftSamplerOptions o;
    o.seq_len = options.seq_len;
    o.batching = options.packing ? SftBatching::packed : SftBatching::padded;
    o.seed = options.seed;
    o.pad_token = sft_meta_.end_of_text.value_or(0);
    train_sampler_.emplace(train_, o);
    epoch_rows_ = train_sampler_->rows_in_epoch(0);
    if (val_.num_examples() > 0) {
      o.shuffle = false;
      val_sampler_.emplace(val_, o);
      val_rows_ = val_sampler_->rows_in_epoch(0);
    }
  }
  const DatasetMeta& meta() const override { return meta_; }
  bool has_positions() const override { return true; }
  void fill_train(int64_t first_row, int count, const RowBuffers& out) override {
    train_sampler_->fill_batch(first_row, count, out);
  }
  int64_t train_rows_in_epochs(int64_t epochs) override { return train_sampler_->rows_before_epoch(epochs); }
  int64_t val_rows() const override { return val_rows_; }
  void fill_val(int64_t row, const RowBuffers& out, int64_t at) override { val_sampler_->fill(row, out, at); }
  std::string describe() const override {
    const auto& o = train_sampler_->options();
    return fmt::format(
        "{} train / {} val examples ({} / {} tokens, {} / {} targets), {} rows of {} tokens "
        "({} per epoch), {} example(s) longer than a row lose their tail",
        sft_meta_.train.examples, sft_meta_.val.examples, sft_meta_.train.tokens, sft_meta_.val.tokens,
        sft_meta_.train.target_tokens, sft_meta_.val.target_tokens,
        o.batching == SftBatching::packed ? "packed" : "padded", o.seq_len, epoch_rows_,
        train_sampler_->examples_longer_than_row());
  }
  nlohmann::json agreement() const override {
    return {{"train_examples", train_.num_examples()},
            {"val_examples", val_.num_examples()},
            {"train_tokens", train_.num_tokens()},
            {"packing", train_sampler_->options().batching == SftBatching::packed}};
  }
 private:
  SftDatasetMeta sft_meta_;
  DatasetMeta meta_;
  SftExampleFile train_, val_;
  std::optional<SftSampler> train_sampler_, val_sampler_;
  int64_t epoch_rows_ = 0;
  int64_t val_rows_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> open_batch_source(const std::string& data_dir,
                                               const BatchSourceOptions& options) {
  if (is_sft_dataset(data_dir)) return std::make_unique<SftRowSource>(data_dir, options);
  return std::make_unique<TokenWindowSource>(data_dir, options);
}

}  // namespace shardlm
