// The tensor-parallel model tests' harness (test_tensor_parallel_llama,
// test_tensor_parallel_gpt2): T ranks of an in-process job, each holding its pieces
// (ParamLayout with a TensorSplit) and computing over its tensor group, against the
// unsplit model on one rank: the loss, the logits and every gradient, on each rank's
// piece of it, within a relative 1e-5 of the norm and 1e-5 of the tensor's largest
// element (fp32: the all-reduce of T partial sums adds in another order than one GEMM
// over the whole inner dimension), and the gradients of whole (replicated) parameters
// bitwise the same on every tensor rank, which is what keeps their copies equal. Two
// accumulating micro-batches with ignored targets; the norm weights and biases are
// perturbed away from their ones / zeros init.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/model_support.hpp"
#include "shardlm/model/param_layout.hpp"

namespace shardlm::tensor_parallel_test {

constexpr int kB = 2, kT = 12;

struct RankRun {
  double loss_sum = 0.0;
  std::map<std::string, std::vector<float>> grads;  // by parameter name, this rank's piece
  std::map<std::string, ParamInfo> info;
  std::vector<float> logits;  // [kB, V] at the last position of an inference forward
};

// A rank's parameters (the init stream's values of its pieces; norm weights and biases
// perturbed away from their ones / zeros init), zeroed gradients, and the per-model-unit
// pointers into both.
struct RankParams {
  std::vector<std::vector<float>> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;
};

inline RankParams make_params(const ParamLayout& layout) {
  RankParams r;
  for (const UnitLayout& u : layout.units) {
    r.params.emplace_back(static_cast<size_t>(u.padded_numel));
    r.grads.emplace_back(static_cast<size_t>(u.padded_numel), 0.0f);
    init_param_range(u, 77, 0, u.padded_numel, r.params.back().data());
    for (const ParamInfo& p : u.params)
      if (p.init == ParamInit::ones || p.init == ParamInit::zeros)
        for (int64_t i = 0; i < p.numel; ++i)
          r.params.back()[static_cast<size_t>(p.offset + i)] =
              (p.init == ParamInit::ones ? 1.0f : 0.0f) + 0.01f * static_cast<float>(p.piece.full_index(p.shape, i) % 7);
  }
  for (const auto& place : layout.model_units) {
    r.param_ptrs.push_back(r.params[static_cast<size_t>(place.unit)].data() + place.base);
    r.grad_ptrs.push_back(r.grads[static_cast<size_t>(place.unit)].data() + place.base);
  }
  return r;
}

// Trains two micro-batches (gradients accumulate) on tensor rank split.rank.
inline RankRun train(const ModelConfig& config, TensorSplit split, Communicator* tensor, bool checkpointing,
              bool sequence_parallel = false) {
  const ParamLayout layout = ParamLayout::build(config, 1, 0, split);
  RankParams rank = make_params(layout);
  std::vector<std::vector<float>>& grads = rank.grads;
  const std::vector<float*>& param_ptrs = rank.param_ptrs;
  const std::vector<float*>& grad_ptrs = rank.grad_ptrs;
  ModelOptions options;
  options.activation_checkpointing = checkpointing;
  options.parallel_groups.tensor = tensor;
  options.sequence_parallel = sequence_parallel;
  MemoryTracker tracker;
  auto model = model_family(config.family).make_model(config, layout, kB, kT, options, tracker);
  RankRun run;
  Rng rng(5);  // the same rows on every tensor rank
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<int32_t> tokens, targets;
    for (int i = 0; i < kB * kT; ++i) {
      tokens.push_back(static_cast<int32_t>(rng.below(config.vocab_size)));
      targets.push_back(i % 5 == 2 ? kIgnoreIndex : static_cast<int32_t>(rng.below(config.vocab_size)));
    }
    const MicroBatch batch{tokens.data(), targets.data(), kB, kT};
    for (int u = 0; u < model->num_units(); ++u)
      model->forward_unit(u, param_ptrs, grad_ptrs, batch, true, 1.0f / 40.0f);
    run.loss_sum += model->last_loss_sum();
    for (int u = model->num_units() - 1; u >= 0; --u) model->backward_unit(u, param_ptrs, grad_ptrs, batch);
    if (micro == 1) {  // the same rows again, without targets: logits (gathered over the group)
      const MicroBatch rows{tokens.data(), nullptr, kB, kT};
      for (int u = 0; u < model->num_units(); ++u) model->forward_unit(u, param_ptrs, {}, rows, false, 1.0f);
      run.logits.resize(static_cast<size_t>(kB) * config.vocab_size);
      model->logits_at(param_ptrs, kT - 1, run.logits.data());
    }
  }
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (const ParamInfo& p : layout.units[u].params) {
      run.grads[p.name].assign(grads[u].begin() + p.offset, grads[u].begin() + p.offset + p.numel);
      run.info[p.name] = p;
    }
  return run;
}

inline void expect_tensor_parallel_equals_one_rank(const ModelConfig& config, int T, bool checkpointing,
                                            bool sequence_parallel = false) {
  const std::string what = config.family +
                           (config.quantize_base == BaseQuant::nf4 ? " qlora" : config.lora.enabled() ? " lora" : "") +
                           " T=" + std::to_string(T) +
                           (checkpointing ? " checkpointing" : "") +
                           (sequence_parallel ? " sequence-parallel" : "");
  SCOPED_TRACE(what);
  const RankRun whole = train(config, {}, nullptr, checkpointing);
  std::vector<RankRun> ranks(static_cast<size_t>(T));
  InProcessJob job(T);
  const std::vector<std::string> errors = job.run([&](Communicator& comm) {
    ranks[static_cast<size_t>(comm.rank())] =
        train(config, {T, comm.rank()}, &comm, checkpointing, sequence_parallel);
  });
  for (int t = 0; t < T; ++t) ASSERT_EQ(errors[static_cast<size_t>(t)], "") << "rank " << t;
  double worst = 0.0, worst_of_largest = 0.0, worst_loss = 0.0;
  for (int t = 0; t < T; ++t) {
    const RankRun& r = ranks[static_cast<size_t>(t)];
    EXPECT_NEAR(r.loss_sum, whole.loss_sum, 1e-6 * std::abs(whole.loss_sum)) << "rank " << t;
    worst_loss = std::max(worst_loss, std::abs(r.loss_sum - whole.loss_sum) / std::abs(whole.loss_sum));
    double logit_diff = 0.0, logit_norm = 0.0;
    for (size_t i = 0; i < whole.logits.size(); ++i) {
      logit_diff += (r.logits[i] - whole.logits[i]) * (r.logits[i] - whole.logits[i]);
      logit_norm += whole.logits[i] * whole.logits[i];
    }
    EXPECT_LT(std::sqrt(logit_diff / logit_norm), 1e-5) << "logits on tensor rank " << t;
    if (t > 0) {
      EXPECT_EQ(r.logits, ranks[0].logits) << "every tensor rank gathers the same logits";
    }
    for (const auto& [name, piece] : r.grads) {
      const ParamInfo& p = r.info.at(name);
      if (p.quantized()) continue;  // a QLoRA base weight: frozen, no gradient
      const std::vector<float>& full = whole.grads.at(name);
      double diff = 0.0, norm = 0.0, largest_diff = 0.0, largest = 0.0;
      for (int64_t i = 0; i < p.numel; ++i) {
        const double ref = full[static_cast<size_t>(p.piece.full_index(p.shape, i))];
        diff += (piece[static_cast<size_t>(i)] - ref) * (piece[static_cast<size_t>(i)] - ref);
        norm += ref * ref;
        largest_diff = std::max(largest_diff, std::abs(piece[static_cast<size_t>(i)] - ref));
        largest = std::max(largest, std::abs(ref));
      }
      if (norm == 0.0) {  // e.g. embedding rows of tokens the batch does not use
        EXPECT_EQ(diff, 0.0) << name << " on tensor rank " << t << ": the reference is zero";
        continue;
      }
      const double rel = std::sqrt(diff / norm);
      worst = std::max(worst, rel);
      worst_of_largest = std::max(worst_of_largest, largest_diff / largest);
      EXPECT_LT(rel, 1e-5) << name << " on tensor rank " << t;
      EXPECT_LT(largest_diff / largest, 1e-5) << name << " on tensor rank " << t << " (of its largest)";
      if (p.piece.whole() && t > 0) {
        EXPECT_EQ(piece, ranks[0].grads.at(name)) << name << ": replicated copies must stay bitwise equal";
      }
    }
  }
  std::printf("%s: loss %.3g relative, worst gradient difference %.3g relative (L2), %.3g of the "
              "tensor's largest\n", what.c_str(), worst_loss, worst, worst_of_largest);
}

inline ModelConfig tiny(const std::string& preset) {
  ModelConfig c = model_preset(preset);
  c.vocab_size = 97;
  c.max_seq_len = 32;
  return c;
}

}  // namespace shardlm::tensor_parallel_test
