// Training micro-batch (forward of every unit, fused head + loss, backward) of GPT-2
// presets in each precision, with and without activation checkpointing: tokens/s,
// peak memory per category, the checkpointing time overhead, the logits memory the
// fused chunked head saves, and what rounding the weights once per use costs.
//   mixed_precision_bench [steps=3] [threads=2] [precisions=fp32,bf16] [preset:B:T ...]
// Default configurations: gpt2-small-30m:8:256 gpt2:4:256.
// Times are medians of `steps` timed steps after one warm-up step; on a shared
// machine they move with the load (CPU time is printed next to wall time).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"

namespace {

using shardlm::DType;
using shardlm::MemCategory;

struct Config {
  std::string preset;
  int B = 0, T = 0;
};

struct Result {
  double wall_s = 0.0, cpu_s = 0.0, loss = 0.0;
  size_t peak[shardlm::MemoryTracker::kNumCategories] = {};
  size_t peak_total = 0;
  int chunk_rows = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result run(const Config& c, DType precision, bool checkpointing, int steps) {
  shardlm::MemoryTracker tracker;
  const shardlm::ModelConfig config = shardlm::model_preset(c.preset);
  const auto layout = shardlm::ParamLayout::build(config, 1);
  shardlm::Gpt2Model model(config, layout, c.B, c.T, {precision, checkpointing}, tracker);
  std::vector<shardlm::TrackedBuffer> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;
  for (int u = 0; u < layout.num_units(); ++u) {
    const size_t bytes = static_cast<size_t>(layout.units[u].padded_numel) * sizeof(float);
    params.emplace_back(MemCategory::params, bytes, tracker);
    grads.emplace_back(MemCategory::grads, bytes, tracker);
    model.init_unit(u, 1234, params.back().as<float>());
  }
  for (const auto& place : layout.model_units) {
    param_ptrs.push_back(params[place.unit].as<float>() + place.base);
    grad_ptrs.push_back(grads[place.unit].as<float>() + place.base);
  }
  std::vector<int32_t> tokens(static_cast<size_t>(c.B) * c.T), targets(tokens.size());
  shardlm::Rng rng(1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng.below(config.vocab_size));
    targets[i] = static_cast<int32_t>(rng.below(config.vocab_size));
  }
  const shardlm::MicroBatch batch{tokens.data(), targets.data(), c.B, c.T};
  const float scale = 1.0f / static_cast<float>(tokens.size());
  std::vector<double> walls, cpus;
  Result r;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up
    shardlm::Stopwatch wall;
    const std::clock_t cpu_start = std::clock();
    for (int u = 0; u < model.num_units(); ++u)
      model.forward_unit(u, param_ptrs, grad_ptrs, batch, true, scale);
    for (int u = model.num_units() - 1; u >= 0; --u)
      model.backward_unit(u, param_ptrs, grad_ptrs, batch);
    if (step > 0) {
      walls.push_back(wall.seconds());
      cpus.push_back(static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC);
    }
    r.loss = model.last_loss_sum() / static_cast<double>(tokens.size());
  }
  r.wall_s = median(walls);
  r.cpu_s = median(cpus);
  for (int k = 0; k < shardlm::MemoryTracker::kNumCategories; ++k)
    r.peak[k] = tracker.peak(static_cast<MemCategory>(k));
  r.peak_total = tracker.peak_total();
  r.chunk_rows = model.logits_chunk_rows();
  return r;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Milliseconds to round `elements` fp32 weights to bf16 once (median of 5).
double weight_rounding_ms(int64_t elements) {
  shardlm::MemoryTracker tracker;  // not the global one, which reports the GEMM scratch
  shardlm::TrackedBuffer src(MemCategory::other, static_cast<size_t>(elements) * 4, tracker);
  shardlm::TrackedBuffer dst(MemCategory::other, static_cast<size_t>(elements) * 2, tracker);
  std::vector<double> ms;
  for (int i = 0; i < 6; ++i) {
    shardlm::Stopwatch w;
    shardlm::cpu::convert(shardlm::TypedPtr(dst.data(), DType::bf16), src.as<float>(), elements);
    if (i > 0) ms.push_back(w.millis());
  }
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  std::vector<DType> precisions;
  {
    std::stringstream list(argc > 3 ? argv[3] : "fp32,bf16");
    for (std::string item; std::getline(list, item, ',');)
      precisions.push_back(shardlm::parse_dtype(item, "precisions"));
  }
  std::vector<Config> configs;
  for (int i = 4; i < argc; ++i) {
    std::string spec = argv[i];
    const size_t a = spec.find(':'), b = spec.rfind(':');
    configs.push_back({spec.substr(0, a), std::atoi(spec.substr(a + 1, b - a - 1).c_str()),
                       std::atoi(spec.substr(b + 1).c_str())});
  }
  if (configs.empty()) configs = {{"gpt2-small-30m", 8, 256}, {"gpt2", 4, 256}};
  omp_set_num_threads(threads);
  std::printf("%d threads; bf16 GEMMs: oneDNN matmul %s; median of %d steps after 1 warm-up\n\n",
              threads, shardlm::cpu::onednn_bf16_matmul_impl(), steps);
  std::printf("| model | B x T | precision | act. ckpt | step s (wall / cpu) | tokens/s | vs fp32 | "
              "ckpt time overhead | loss | params MiB | grads MiB | activations MiB | other MiB | "
              "peak total MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  std::vector<std::string> notes;
  for (const Config& c : configs) {
    double fp32_wall = 0.0;
    int chunk_rows = 0;
    for (DType precision : precisions) {
      double plain_wall = 0.0;
      for (bool checkpointing : {false, true}) {
        const Result r = run(c, precision, checkpointing, steps);
        chunk_rows = r.chunk_rows;
        if (precision == DType::fp32 && !checkpointing) fp32_wall = r.wall_s;
        if (!checkpointing) plain_wall = r.wall_s;
        const double tokens_per_s = static_cast<double>(c.B) * c.T / r.wall_s;
        const std::string speedup =
            fp32_wall > 0 ? fmt::format("{:.2f}x", fp32_wall / r.wall_s) : "-";
        const std::string overhead =
            checkpointing ? fmt::format("{:+.0f}%", 100.0 * (r.wall_s / plain_wall - 1.0)) : "-";
        std::printf("| %s | %d x %d | %s | %s | %.2f / %.2f | %.0f | %s | %s | %.4f | %.1f | %.1f | "
                    "%.1f | %.1f | %.1f |\n",
                    c.preset.c_str(), c.B, c.T, std::string(shardlm::dtype_name(precision)).c_str(),
                    checkpointing ? "on" : "off", r.wall_s, r.cpu_s, tokens_per_s,
                    speedup.c_str(), overhead.c_str(), r.loss, mib(r.peak[static_cast<int>(MemCategory::params)]),
                    mib(r.peak[static_cast<int>(MemCategory::grads)]),
                    mib(r.peak[static_cast<int>(MemCategory::activations)]),
                    mib(r.peak[static_cast<int>(MemCategory::other)]), mib(r.peak_total));
        std::fflush(stdout);
      }
    }
    const shardlm::ModelConfig config = shardlm::model_preset(c.preset);
    const size_t full_logits = static_cast<size_t>(c.B) * c.T * config.vocab_size * sizeof(float);
    const size_t chunk = static_cast<size_t>(chunk_rows) * config.padded_vocab_size() * sizeof(float);
    // Rounded per step: every block twice (forward; backward, shared with the
    // recompute) and the head's [V, C] once.
    const int64_t block_weights = 12ll * config.n_embd * config.n_embd;
    const int64_t per_step = 2 * config.n_layer * block_weights +
                             static_cast<int64_t>(config.vocab_size) * config.n_embd;
    notes.push_back(fmt::format(
        "{} B={} T={}: fused head holds {} rows x {} logits = {:.1f} MiB instead of the full "
        "B*T*V*4 = {:.1f} MiB (and as many dlogits): {:.1f} MiB saved. bf16 weight rounding: "
        "{:.1f}M values per step, {:.1f} ms.",
        c.preset, c.B, c.T, chunk_rows, config.padded_vocab_size(), mib(chunk), mib(full_logits),
        mib(full_logits > chunk ? full_logits - chunk : 0), per_step / 1e6,
        weight_rounding_ms(per_step)));
  }
  std::printf("\n");
  for (const auto& n : notes) std::printf("%s\n", n.c_str());
  // The GEMM's widening scratch (fp16, or bf16 without oneDNN support) is one per
  // thread and process, tracked by the global tracker, not the per-run ones above.
  std::printf("GEMM widening scratch (category other, process-wide): %.1f MiB\n",
              mib(shardlm::MemoryTracker::global().peak(MemCategory::other)));
  return 0;
}
