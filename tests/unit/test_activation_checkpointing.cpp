// Activation checkpointing: the same kernels in the same order, so the loss and every
// gradient are BITWISE identical with and without it (on the PyTorch fixture's model
// and batch, on a larger random model with ignored targets and two accumulating
// micro-batches, and under bf16 compute); and activation memory, asserted as byte
// counts computed here from the shapes, drops from L blocks' activations to one
// block's plus the L + 1 unit boundaries.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"

namespace {

struct Weights {
  std::vector<std::vector<float>> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;
  explicit Weights(const shardlm::ParamLayout& layout) {
    for (const auto& unit : layout.units) {
      params.emplace_back(unit.padded_numel, 0.0f);
      grads.emplace_back(unit.padded_numel, 0.0f);
    }
    point(layout);
  }
  // The model takes one pointer per model unit, where the layout placed it.
  void point(const shardlm::ParamLayout& layout) {
    param_ptrs.clear();
    grad_ptrs.clear();
    for (const auto& place : layout.model_units) {
      param_ptrs.push_back(params[place.unit].data() + place.base);
      grad_ptrs.push_back(grads[place.unit].data() + place.base);
    }
  }
};

struct Batch {
  std::vector<int32_t> tokens, targets;
  int B = 0, T = 0;
  shardlm::MicroBatch micro(int row0 = 0, int rows = -1) const {
    const size_t off = static_cast<size_t>(row0) * T;
    return {tokens.data() + off, targets.data() + off, rows < 0 ? B : rows, T};
  }
};

Batch random_batch(int B, int T, int vocab, uint64_t seed) {
  Batch b;
  b.B = B;
  b.T = T;
  shardlm::Rng rng(seed);
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(vocab)));
    b.targets.push_back(i % 7 == 3 ? shardlm::kIgnoreIndex : static_cast<int32_t>(rng.below(vocab)));
  }
  return b;
}

void train_micro_batch(shardlm::Gpt2Model& model, Weights& w, const shardlm::MicroBatch& batch,
                       float scale) {
  for (int u = 0; u < model.num_units(); ++u)
    model.forward_unit(u, w.param_ptrs, w.grad_ptrs, batch, true, scale);
  for (int u = model.num_units() - 1; u >= 0; --u)
    model.backward_unit(u, w.param_ptrs, w.grad_ptrs, batch);
}

struct Result {
  std::vector<double> loss_sums;
  std::vector<std::vector<float>> grads;
};

// Trains `batch` as `splits` micro-batches accumulating into one gradient, with an
// evaluation forward in between (it must not disturb what backward recomputes).
Result run(const shardlm::ModelConfig& config, const shardlm::ParamLayout& layout,
           const Weights& init, const Batch& batch, int splits,
           const shardlm::ModelOptions& options) {
  shardlm::Gpt2Model model(config, layout, batch.B / splits, batch.T, options);
  Weights w = init;
  w.point(layout);
  Result r;
  const int rows = batch.B / splits;
  for (int s = 0; s < splits; ++s) {
    const shardlm::MicroBatch micro = batch.micro(s * rows, rows);
    for (int u = 0; u < model.num_units(); ++u)
      model.forward_unit(u, w.param_ptrs, {}, micro, false, 0.0f);
    train_micro_batch(model, w, micro, 1.0f / 97.0f);
    r.loss_sums.push_back(model.last_loss_sum());
  }
  r.grads = w.grads;
  return r;
}

void expect_bitwise_equal(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.loss_sums.size(), b.loss_sums.size());
  for (size_t i = 0; i < a.loss_sums.size(); ++i)
    EXPECT_EQ(a.loss_sums[i], b.loss_sums[i]) << what << " micro-batch " << i;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t u = 0; u < a.grads.size(); ++u) {
    ASSERT_EQ(a.grads[u].size(), b.grads[u].size());
    size_t differing = 0;
    for (size_t i = 0; i < a.grads[u].size(); ++i)
      differing += std::bit_cast<uint32_t>(a.grads[u][i]) != std::bit_cast<uint32_t>(b.grads[u][i]);
    EXPECT_EQ(differing, 0u) << what << ": unit " << u << " has " << differing
                             << " gradient values that differ";
  }
  // The comparison is not vacuous: gradients are nonzero.
  double sum_abs = 0.0;
  for (const auto& g : a.grads)
    for (float v : g) sum_abs += std::fabs(v);
  EXPECT_GT(sum_abs, 0.0) << what;
}

TEST(ActivationCheckpointing, FixtureModelGradientsAreBitwiseIdentical) {
  namespace st = shardlm::safetensors;
  const st::File file = st::read_file(std::string(SHARDLM_FIXTURE_DIR) + "/gpt2_fixture.safetensors");
  const auto config = shardlm::ModelConfig::from_json(nlohmann::json::parse(file.metadata.at("config")));
  const auto batch_json = nlohmann::json::parse(file.metadata.at("batch"));
  Batch batch;
  batch.B = batch_json.at("B").get<int>();
  batch.T = batch_json.at("T").get<int>();
  for (auto v : file.at("tokens").to_i64()) batch.tokens.push_back(static_cast<int32_t>(v));
  for (auto v : file.at("targets").to_i64()) batch.targets.push_back(static_cast<int32_t>(v));
  const auto layout = shardlm::ParamLayout::build(config, 1);
  Weights init(layout);
  for (const auto* p : layout.all_params()) {
    const auto [unit, info] = layout.find(p->name);
    const auto values = file.at(p->name).to_f32();
    std::copy(values.begin(), values.end(), init.params[unit].begin() + info->offset);
  }
  const Result plain = run(config, layout, init, batch, 1, {shardlm::DType::fp32, false});
  const Result checkpointed = run(config, layout, init, batch, 1, {shardlm::DType::fp32, true});
  expect_bitwise_equal(plain, checkpointed, "fixture");
}

shardlm::ModelConfig larger_config() {
  shardlm::ModelConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 301;
  c.max_seq_len = 64;
  return c;
}

Weights random_init(const shardlm::Gpt2Model& model) {
  Weights w(model.layout());
  for (int u = 0; u < model.layout().num_units(); ++u) model.init_unit(u, 11, w.params[u].data());
  // Non-trivial LayerNorm weights and biases, so no gradient path is degenerate.
  shardlm::Rng rng(5);
  for (const auto* p : model.layout().all_params()) {
    if (p->init == shardlm::ParamInit::normal) continue;
    const auto [unit, info] = model.layout().find(p->name);
    for (int64_t i = 0; i < info->numel; ++i)
      w.params[unit][info->offset + i] += static_cast<float>(0.1 * rng.normal());
  }
  return w;
}

TEST(ActivationCheckpointing, LargerModelWithAccumulationIsBitwiseIdentical) {
  const auto config = larger_config();
  // Merged units (the tied head reads wte from a merged unit) and world-size padding.
  const auto layout = shardlm::ParamLayout::build(config, 3, 60000);
  shardlm::Gpt2Model sizing(config, layout, 1, 1);
  const Weights init = random_init(sizing);
  const Batch batch = random_batch(4, 37, config.vocab_size, 3);
  for (int splits : {1, 2}) {
    const Result plain = run(config, layout, init, batch, splits, {shardlm::DType::fp32, false});
    const Result checkpointed = run(config, layout, init, batch, splits, {shardlm::DType::fp32, true});
    expect_bitwise_equal(plain, checkpointed, "splits " + std::to_string(splits));
  }
}

TEST(ActivationCheckpointing, Bf16GradientsAreBitwiseIdenticalToo) {
  const auto config = larger_config();
  const auto layout = shardlm::ParamLayout::build(config, 1);
  shardlm::Gpt2Model sizing(config, layout, 1, 1);
  const Weights init = random_init(sizing);
  const Batch batch = random_batch(2, 45, config.vocab_size, 4);
  for (shardlm::DType precision : {shardlm::DType::bf16, shardlm::DType::fp16}) {
    const Result plain = run(config, layout, init, batch, 1, {precision, false});
    const Result checkpointed = run(config, layout, init, batch, 1, {precision, true});
    expect_bitwise_equal(plain, checkpointed, std::string(shardlm::dtype_name(precision)));
  }
}

// Bytes of the arrays the model carves, each rounded up to 64 bytes (its alignment).
struct ByteCount {
  size_t total = 0;
  void add(int64_t elements, size_t element_bytes) {
    total += (static_cast<size_t>(elements) * element_bytes + 63) / 64 * 64;
  }
};

TEST(ActivationCheckpointing, ActivationBytesDropToOneBlockPlusBoundaries) {
  auto config = larger_config();
  config.n_layer = 6;
  config.max_seq_len = 128;
  const auto layout = shardlm::ParamLayout::build(config, 1);
  const int B = 4, T = 128;
  const int64_t N = int64_t{B} * T, C = config.n_embd, H = config.n_head, L = config.n_layer;
  const int64_t Vp = config.padded_vocab_size();

  for (shardlm::DType precision : {shardlm::DType::fp32, shardlm::DType::bf16}) {
    const size_t ct = shardlm::dtype_bytes(precision);
    // One block's saved activations: ln1 (C), qkv (3C), att (C), ln2 (C), the GELU
    // input and output (4C each) in the compute type; res2 (C), two LayerNorms' mean
    // and rstd and the attention's log-sum-exp (H) in fp32.
    ByteCount block;
    for (int64_t cols : {C, 3 * C, C, C, 4 * C, 4 * C}) block.add(N * cols, ct);
    for (int64_t cols : {C, int64_t{1}, int64_t{1}, int64_t{1}, int64_t{1}, H}) block.add(N * cols, 4);
    // Everything else, whatever the mode: the L + 1 unit boundaries, the final norm
    // and the head (at most N rows of logits), the backward scratch.
    ByteCount rest;
    for (int64_t l = 0; l <= L; ++l) rest.add(N * C, 4);
    rest.add(N * C, ct);  // ln_f output
    for (int64_t elements : {N * C, N, N, N * C, N * Vp, N, N * C, N * C, 4 * N * C})
      rest.add(elements, 4);  // branch, ln_f stats, dlnf, logits, row loss, dres, dsmall, dbig
    if (precision != shardlm::DType::fp32) {
      // dres, dbig and the head's dlogits rounded for the GEMMs.
      for (int64_t elements : {N * C, 4 * N * C, N * Vp}) rest.add(elements, ct);
    }

    shardlm::MemoryTracker plain_tracker, checkpointed_tracker;
    shardlm::Gpt2Model plain(config, layout, B, T, {precision, false}, plain_tracker);
    shardlm::Gpt2Model checkpointed(config, layout, B, T, {precision, true}, checkpointed_tracker);
    const size_t plain_bytes = plain_tracker.current(shardlm::MemCategory::activations);
    const size_t checkpointed_bytes = checkpointed_tracker.current(shardlm::MemCategory::activations);
    const std::string what(shardlm::dtype_name(precision));
    EXPECT_LE(checkpointed_bytes, block.total + rest.total) << what;
    EXPECT_GE(plain_bytes, L * block.total) << what;
    EXPECT_EQ(plain_bytes - checkpointed_bytes, (L - 1) * block.total) << what;
    std::printf("%s: activations %zu bytes without checkpointing, %zu with (bound %zu; one block "
                "%zu, the rest %zu)\n",
                what.c_str(), plain_bytes, checkpointed_bytes, block.total + rest.total,
                block.total, rest.total);
  }
}

}  // namespace
