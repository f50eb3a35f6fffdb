// step_gemm_rate: the GEMM library alone, on exactly the GEMM calls one training
// step of a model preset of any family makes (recorded by cpu::GemmRecorder while the
// model runs one training micro-batch: every linear layer forward and backward, and
// the fused LM head in the row chunks the model uses), at the step's precision and
// thread count. Prints one JSON line, so bench/speed_vs_pytorch.py can
// compare a training step's achieved model GFLOP/s with the library's own rate
// (docs/profiling.md).
//
//   step_gemm_rate [--model gpt2-small-30m|smollm2-135m|...|HF-DIR] [--batch 8] [--seq 256] [--precision fp32]
//                  [--threads 2] [--min-time 0.3] [--passes 3] [--quiet-wait 0] [--flush-mb 96]
//
// Each distinct call shape is timed through cpu::gemm (the model's entry point: fp32
// runs cpu::sgemm, bf16 oneDNN's matmul primitive) on buffers allocated and touched
// once: the median of >= 3 runs after a warm-up, best of --passes passes spread over
// the whole run. The library's rate on the step is FLOP-weighted:
//   gemm_gflops = sum(flops x calls) / sum(best median seconds x calls).
// Timed back to back, a shape's operands stay in the caches (up to 32 MiB of L3 here)
// between runs, which a training step's GEMMs do not enjoy: their weights and most
// activations were last touched a layer or more ago. So each shape is also timed with
// the caches flushed before every run (--flush-mb of memory written and read by
// every thread, untimed): cold_gemm_gflops, a bound from the other side.
// Model FLOPs, counted analytically for the same step:
//   step_gemm_flops = sum over those calls of 2 M N K (LM head over the real vocabulary),
//   attention_flops = causal attention's matmuls, 6 (H hd) T (T + 1) per layer and
//                     sequence: QK^T and PV forward, dP, dV, dQ, dK backward, each
//                     2 x head_dim FLOPs per visible (query, key) pair per query head,
//                     T (T + 1) / 2 pairs (GPT-2: H hd = C);
//   model_flops = step_gemm_flops + attention_flops.
// Without activation checkpointing (whose recomputed forward GEMMs are not model FLOPs).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "quiet_machine.hpp"
#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/backend/cpu/gemm_recorder.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

namespace {

using shardlm::bench::load_average;
using shardlm::bench::wait_until_quiet;

using shardlm::DType;
using shardlm::Stopwatch;

// One distinct GEMM shape of the step and how often the step makes it.
struct Call {
  shardlm::cpu::GemmCall shape;
  long calls = 0;

  double flops() const { return 2.0 * shape.M * shape.N * shape.K; }
  size_t a_elems() const { return static_cast<size_t>(shape.trans_a ? shape.K : shape.M) * shape.lda; }
  size_t b_elems() const { return static_cast<size_t>(shape.trans_b ? shape.N : shape.K) * shape.ldb; }
  size_t c_elems() const { return static_cast<size_t>(shape.M) * shape.ldc; }
  std::string name() const {
    return fmt::format("{}{} {}x{}x{}{}", shape.trans_a ? 'T' : 'N', shape.trans_b ? 'T' : 'N',
                       shape.M, shape.N, shape.K, shape.beta != 0.0f ? " +=" : "");
  }
};

// The GEMM calls of one training micro-batch of `config` (forward and backward of every
// unit through a single-process strategy, parameters in the step's precision as the
// trainer hands them), grouped by shape; and the LM head's chunk rows.
std::vector<Call> record_step_calls(const shardlm::ModelConfig& config, int B, int T,
                                    DType precision, int* chunk_rows) {
  shardlm::MemoryTracker tracker;
  const auto layout = shardlm::ParamLayout::build(config, 1);
  const shardlm::ModelOptions options{precision, false};
  auto model = shardlm::model_family(config.family).make_model(config, layout, B, T, options, tracker);
  *chunk_rows = model->logits_chunk_rows();
  shardlm::SingleProcessCommunicator comm;
  shardlm::StrategyOptions strategy_options;
  strategy_options.param_dtype = precision;
  shardlm::FlatUnitStrategy strategy(layout, model->unit_needs(), comm, strategy_options, tracker);
  for (int u = 0; u < layout.num_units(); ++u) {
    shardlm::OwnedSlice s = strategy.owned(u);
    model->init_range(u, 1234, s.begin, s.end, s.master);
  }
  strategy.after_load();
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(config.vocab_size));
    targets[i] = static_cast<int32_t>((i * 104729 + 1) % static_cast<size_t>(config.vocab_size));
  }
  shardlm::ModelRunner runner(*model, strategy);
  const shardlm::MicroBatch batch{tokens.data(), targets.data(), B, T};
  std::vector<Call> calls;
  {
    shardlm::cpu::GemmRecorder recorder;
    strategy.begin_step(1);
    runner.forward(batch, true, 1.0f / static_cast<float>(tokens.size()));
    runner.backward(batch, 0);
    for (const auto& shape : recorder.calls()) {
      auto it = std::find_if(calls.begin(), calls.end(), [&](const Call& c) { return c.shape == shape; });
      if (it == calls.end()) {
        calls.push_back({shape, 1});
      } else {
        ++it->calls;
      }
    }
  }
  strategy.finish_gradients();
  return calls;
}

// prepare (untimed) runs before every timed run. min_time bounds the wall time of the
// timed runs and their preparations together: a cache flush costs far more than a small
// GEMM, and counting only the GEMM made a MoE step's ~200 small expert shapes take
// 200 flushes each (over 14 minutes per configuration).
double median_seconds(const std::function<void()>& run, double min_time,
                      const std::function<void()>& prepare) {
  Stopwatch prep;
  prepare();
  const double prepare_seconds = prep.seconds();
  Stopwatch warm;
  run();
  const double first = warm.seconds();
  const int reps = std::clamp(
      static_cast<int>(min_time / std::max(first + prepare_seconds, 1e-7)), 3, 200);
  std::vector<double> times(static_cast<size_t>(reps));
  for (auto& t : times) {
    prepare();
    Stopwatch sw;
    run();
    t = sw.seconds();
  }
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[static_cast<size_t>(reps / 2)];
}



// Evicts the operands from every thread's L2 and the shared L3: each OpenMP thread
// writes and reads back its share of a buffer larger than the caches.
class CacheFlusher {
 public:
  explicit CacheFlusher(size_t bytes) : data_(bytes / sizeof(float), 1.0f) {}
  void operator()() {
    const int64_t n = static_cast<int64_t>(data_.size());
    float sum = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) {
      data_[static_cast<size_t>(i)] += 1.0f;
      sum += data_[static_cast<size_t>(i)];
    }
    sink_ = sum;  // keeps the loop from being optimised away
  }

 private:
  std::vector<float> data_;
  volatile float sink_ = 0.0f;
};

// One buffer per operand, sized for the largest call and filled once; 64-byte
// aligned like the model's arena (row alignment changes some GEMM kernels' speed).
struct Operand {
  shardlm::TrackedBuffer buffer;
  Operand(DType dtype, size_t elems, uint64_t seed)
      : buffer(shardlm::MemCategory::other, elems * shardlm::dtype_bytes(dtype)) {
    std::vector<float> values(elems);
    shardlm::Rng rng(seed);
    for (auto& x : values) x = static_cast<float>(rng.uniform() - 0.5) * 0.1f;
    shardlm::cpu::convert(shardlm::TypedPtr(buffer.data(), dtype), values.data(),
                          static_cast<int64_t>(elems));
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "gpt2-small-30m", precision_name = "fp32";
  int B = 8, T = 256, threads = 2, passes = 3;
  double min_time = 0.3, quiet_wait = 0.0, flush_mb = 96.0;
  CLI::App app{"GEMM library rate on one training step's GEMM calls (one JSON line)"};
  app.add_option("--model", preset, "model preset, or a directory with a Hugging Face config.json");
  app.add_option("--batch", B, "micro-batch size")->check(CLI::PositiveNumber);
  app.add_option("--seq", T, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--precision", precision_name, "fp32, bf16 or fp16 (the step's compute type)");
  app.add_option("--threads", threads, "OpenMP threads")->check(CLI::PositiveNumber);
  app.add_option("--min-time", min_time, "seconds of timed runs per call shape, all passes");
  app.add_option("--passes", passes, "passes over all shapes; best per shape")
      ->check(CLI::PositiveNumber);
  app.add_option("--quiet-wait", quiet_wait,
                 "seconds to wait for other processes to go idle before each shape (0: never)");
  app.add_option("--flush-mb", flush_mb,
                 "MiB written and read before each cold timed run (> the caches)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    const shardlm::ModelConfig config = shardlm::is_hf_model_path(preset)
                                            ? shardlm::read_hf_model_config(preset)
                                            : shardlm::model_preset(preset);
    const DType precision = shardlm::parse_dtype(precision_name, "--precision");
    omp_set_num_threads(threads);
    int chunk_rows = 0;
    const std::vector<Call> calls = record_step_calls(config, B, T, precision, &chunk_rows);

    size_t na = 0, nb = 0, nc = 0;
    for (const auto& c : calls) {
      na = std::max(na, c.a_elems());
      nb = std::max(nb, c.b_elems());
      nc = std::max(nc, c.c_elems());
    }
    // Operands in both types the calls read (activations, weights, gradients).
    const Operand a32(DType::fp32, na, 1), b32(DType::fp32, nb, 2);
    const Operand a16(precision, precision == DType::fp32 ? 1 : na, 1),
        b16(precision, precision == DType::fp32 ? 1 : nb, 2);
    const Operand c(DType::fp32, nc, 3);

    CacheFlusher flush(static_cast<size_t>(flush_mb * (1 << 20)));
    const std::function<void()> keep_caches = [] {};
    std::vector<double> best(calls.size(), 1e30), best_cold(calls.size(), 1e30);
    std::vector<bool> quiet(calls.size(), false);
    for (int pass = 0; pass < passes; ++pass)
      for (size_t i = 0; i < calls.size(); ++i) {
        const shardlm::cpu::GemmCall& s = calls[i].shape;
        const Operand& a = s.a_type == DType::fp32 ? a32 : a16;
        const Operand& b = s.b_type == DType::fp32 ? b32 : b16;
        const auto run = [&] {
          shardlm::cpu::gemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f,
                             shardlm::ConstTypedPtr(a.buffer.data(), s.a_type), s.lda,
                             shardlm::ConstTypedPtr(b.buffer.data(), s.b_type), s.ldb,
                             s.beta, c.buffer.as<float>(), s.ldc);
        };
        const bool was_quiet = quiet_wait > 0 && wait_until_quiet(quiet_wait);
        const double t = median_seconds(run, min_time / passes, keep_caches);
        if (t < best[i]) {
          best[i] = t;
          quiet[i] = was_quiet;
        }
        best_cold[i] = std::min(best_cold[i], median_seconds(run, min_time / passes, flush));
      }

    double gemm_flops = 0.0, gemm_seconds = 0.0, cold_seconds = 0.0;
    nlohmann::json shapes = nlohmann::json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      const Call& s = calls[i];
      gemm_flops += s.flops() * static_cast<double>(s.calls);
      gemm_seconds += best[i] * static_cast<double>(s.calls);
      cold_seconds += best_cold[i] * static_cast<double>(s.calls);
      shapes.push_back({{"name", s.name()},
                        {"op", fmt::format("{}{}", s.shape.trans_a ? 'T' : 'N', s.shape.trans_b ? 'T' : 'N')},
                        {"M", s.shape.M}, {"N", s.shape.N}, {"K", s.shape.K}, {"calls", s.calls},
                        {"gflops", s.flops() / best[i] * 1e-9},
                        {"cold_gflops", s.flops() / best_cold[i] * 1e-9}, {"quiet", quiet[i]}});
    }
    const double Q = static_cast<double>(config.n_head) * config.head_dim();
    const double attention_flops = 6.0 * Q * T * (T + 1.0) * B * config.n_layer;
    const std::string library =
        precision == DType::fp32
            ? fmt::format("{} sgemm", shardlm::cpu::gemm_library_name())
            : (precision == DType::bf16 && shardlm::cpu::onednn_has_bf16_matmul()
                   ? fmt::format("oneDNN matmul {}", shardlm::cpu::onednn_bf16_matmul_impl())
                   : fmt::format("widened to fp32, {} sgemm", shardlm::cpu::gemm_library_name()));
    const nlohmann::json out = {
        {"model", preset}, {"batch", B}, {"seq", T}, {"precision", precision_name},
        {"threads", threads}, {"library", library}, {"head_chunk_rows", chunk_rows},
        {"step_gemm_flops", gemm_flops}, {"step_gemm_seconds", gemm_seconds},
        {"gemm_gflops", gemm_flops / gemm_seconds * 1e-9},
        {"cold_step_gemm_seconds", cold_seconds},
        {"cold_gemm_gflops", gemm_flops / cold_seconds * 1e-9}, {"flush_mb", flush_mb},
        {"attention_flops", attention_flops},
        {"model_flops", gemm_flops + attention_flops}, {"load_average", load_average()},
        {"shapes", shapes}};
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_gemm_rate: %s\n", e.what());
    return 1;
  }
  return 0;
}
