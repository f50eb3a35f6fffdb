// Where the trainer's rows come from: token windows of a text dataset (`prepare`:
// train.bin/val.bin, every position a target) or conversations of an SFT dataset
// (`prepare --sft`: train.sft/val.sft with loss masks, padded or packed rows with
// positions restarting per example). The step loop asks for rows by global index
// (BatchPartition splits a step's rows over ranks and micro-batches), so both kinds
// give every strategy and world size the same rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sft_sampler.hpp"

namespace shardlm {

// rows x seq_len int32 arrays, row-major; positions and key_begin are written only
// when the source has_positions().
using RowBuffers = SftBatch;

// An empty row (no targets; positions, when `positions`, from 0) at row `at` of `out`:
// the evaluation's rows past the end.
void fill_empty_row(const RowBuffers& out, int64_t at, int seq_len, bool positions);

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The dataset's tokenizer, vocabulary and source digests, as a text dataset's meta.
  virtual const DatasetMeta& meta() const = 0;
  // Whether rows carry position ids and example starts (packed or padded examples).
  virtual bool has_positions() const = 0;
  // Global training rows [first, first + count) into rows 0..count-1 of `out`.
  virtual void fill_train(int64_t first_row, int count, const RowBuffers& out) = 0;
  // Training rows in the first `epochs` passes over the data (SFT's --epochs).
  virtual int64_t train_rows_in_epochs(int64_t epochs) = 0;
  // Validation rows (in file order), and row `row` of them into row `at` of `out`.
  virtual int64_t val_rows() const = 0;
  virtual void fill_val(int64_t row, const RowBuffers& out, int64_t at) = 0;
  // "N train / M val tokens" and what was counted about the rows.
  virtual std::string describe() const = 0;
  // What every rank must agree on, beyond the meta's digests.
  virtual nlohmann::json agreement() const = 0;
  int seq_len() const { return seq_len_; }

 protected:
  explicit BatchSource(int seq_len) : seq_len_(seq_len) {}
  int seq_len_;
};

struct BatchSourceOptions {
  int seq_len = 0;
  uint64_t seed = 0;
  bool packing = false;  // SFT: several whole examples per row instead of one
};

// Opens DIR as the kind of dataset its meta.json says. Error (one line) for a
// missing or corrupt dataset, or --packing on a text dataset.
std::unique_ptr<BatchSource> open_batch_source(const std::string& data_dir,
                                               const BatchSourceOptions& options);

}  // namespace shardlm
