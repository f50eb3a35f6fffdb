#include "shardlm/data/sft_sampler.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/model/model.hpp"

namespace shardlm {

SftSampler::SftSampler(const SftExampleFile& file, const SftSamplerOptions& options)
    : file_(&file), options_(options) {
  SHARDLM_CHECK(options.seq_len >= 1, "sequence length {} (expected at least 1)", options.seq_len);
  SHARDLM_CHECK(file.num_examples() > 0, "SFT example file {} has no examples", file.path());
  SHARDLM_CHECK(options.pad_token >= 0 && options.pad_token < file.vocab_size(),
                "padding token {} (expected an id below the vocabulary size {} of {})", options.pad_token,
                file.vocab_size(), file.path());
  for (int64_t e = 0; e < file.num_examples(); ++e)
    examples_longer_than_row_ += file.example_length(e) - 1 > options.seq_len;
}

int64_t SftSampler::positions_of(int64_t example) const {
  return std::min<int64_t>(file_->example_length(example) - 1, options_.seq_len);
}

void SftSampler::load_epoch(int64_t epoch) {
  const int64_t n = file_->num_examples();
  int64_t* order = static_cast<int64_t*>(order_.grow_to(MemCategory::other, static_cast<size_t>(n) * sizeof(int64_t)));
  int64_t* starts =
      static_cast<int64_t*>(row_starts_.grow_to(MemCategory::other, static_cast<size_t>(n + 1) * sizeof(int64_t)));
  if (options_.shuffle) {
    epoch_permutation(options_.seed, epoch, order, n);
  } else {
    for (int64_t i = 0; i < n; ++i) order[i] = i;
  }
  int64_t rows = 0;
  if (options_.batching == SftBatching::padded) {
    for (int64_t i = 0; i <= n; ++i) starts[i] = i;
    rows = n;
  } else {  // next fit: a row takes examples while they fit; every example fits an empty row
    int64_t used = options_.seq_len;  // forces a new row for the first example
    for (int64_t i = 0; i < n; ++i) {
      const int64_t need = positions_of(order[i]);
      if (used + need > options_.seq_len) {
        starts[rows++] = i;
        used = 0;
      }
      used += need;
    }
    starts[rows] = n;
  }
  cached_epoch_ = epoch;
  cached_rows_ = rows;
  if (static_cast<int64_t>(epoch_rows_.size()) == epoch) epoch_rows_.push_back(rows);
}

int64_t SftSampler::rows_in_epoch(int64_t epoch) {
  SHARDLM_CHECK(epoch >= 0, "epoch {} (expected >= 0)", epoch);
  if (options_.batching == SftBatching::padded) return file_->num_examples();
  while (static_cast<int64_t>(epoch_rows_.size()) <= epoch) load_epoch(static_cast<int64_t>(epoch_rows_.size()));
  return epoch_rows_[epoch];
}

int64_t SftSampler::rows_before_epoch(int64_t epoch) {
  int64_t rows = 0;
  for (int64_t e = 0; e < epoch; ++e) rows += rows_in_epoch(e);
  return rows;
}

std::pair<int64_t, int64_t> SftSampler::locate(int64_t global_row) {
  SHARDLM_CHECK(global_row >= 0, "global row {} (expected >= 0)", global_row);
  int64_t epoch = 0;
  if (options_.batching == SftBatching::padded) {
    epoch = global_row / file_->num_examples();
    global_row -= epoch * file_->num_examples();
  } else {
    for (int64_t rows = rows_in_epoch(epoch); global_row >= rows; rows = rows_in_epoch(++epoch)) global_row -= rows;
  }
  if (epoch != cached_epoch_) load_epoch(epoch);
  return {epoch, global_row};
}

std::vector<int64_t> SftSampler::examples_of(int64_t global_row) {
  const int64_t row = locate(global_row).second;
  const int64_t* order = order_.as<int64_t>();
  const int64_t* starts = row_starts_.as<int64_t>();
  return std::vector<int64_t>(order + starts[row], order + starts[row + 1]);
}

int64_t SftSampler::fill(int64_t global_row, const SftBatch& batch, int64_t row) {
  const int64_t in_epoch = locate(global_row).second;
  const int64_t* order = order_.as<int64_t>();
  const int64_t* starts = row_starts_.as<int64_t>();
  const int T = options_.seq_len;
  const int64_t offset = row * T;
  int32_t* tokens = batch.tokens + offset;
  int32_t* targets = batch.targets + offset;
  int32_t* positions = batch.positions + offset;
  int32_t* key_begin = batch.key_begin + offset;
  int64_t targets_in_row = 0;
  int t = 0;
  for (int64_t i = starts[in_epoch]; i < starts[in_epoch + 1]; ++i) {
    const int64_t example = order[i];
    const int64_t first = file_->example_begin(example);
    const int64_t n = positions_of(example);
    const int begin = t;
    for (int64_t j = 0; j < n; ++j, ++t) {
      tokens[t] = file_->token(first + j);
      const bool is_target = file_->is_target(first + j + 1);
      targets[t] = is_target ? file_->token(first + j + 1) : kIgnoreIndex;
      targets_in_row += is_target;
      positions[t] = static_cast<int32_t>(j);
      key_begin[t] = begin;
    }
  }
  SHARDLM_ASSERT(t <= T);
  for (const int pad_begin = t; t < T; ++t) {
    tokens[t] = options_.pad_token;
    targets[t] = kIgnoreIndex;
    positions[t] = t - pad_begin;
    key_begin[t] = pad_begin;
  }
  return targets_in_row;
}

int64_t SftSampler::fill_batch(int64_t first_global_row, int64_t count, const SftBatch& batch) {
  int64_t targets = 0;
  for (int64_t r = 0; r < count; ++r) targets += fill(first_global_row + r, batch, r);
  return targets;
}

}  // namespace shardlm
