// step_gemm_rate: the GEMM library alone, on exactly the GEMM calls one training
// step of a GPT-2 preset makes (forward and backward of every block's four linear
// layers, and the fused LM head in the row chunks the model uses), at the step's
// precision and thread count. Prints one JSON line, so bench/speed_vs_pytorch.py can
// compare a training step's achieved model GFLOP/s with the library's own rate
// (docs/profiling.md).
//
//   step_gemm_rate [--model gpt2-small-30m] [--batch 8] [--seq 256] [--precision fp32]
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
//   attention_flops = causal attention's matmuls, 6 C T (T + 1) per layer and sequence:
//                     QK^T and PV forward, dP, dV, dQ, dK backward, each 2 x head_dim
//                     FLOPs per visible (query, key) pair per head, T (T + 1) / 2 pairs;
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
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"
#include "shardlm/model/param_layout.hpp"

namespace {

using shardlm::bench::load_average;
using shardlm::bench::wait_until_quiet;

using shardlm::DType;
using shardlm::Stopwatch;

struct Call {
  std::string name;
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  int lda = 0, ldb = 0, ldc = 0;
  float beta = 0.0f;
  long calls = 0;  // per training step

  double flops() const { return 2.0 * M * N * K; }
  size_t a_elems() const { return static_cast<size_t>(trans_a ? K : M) * lda; }
  size_t b_elems() const { return static_cast<size_t>(trans_b ? N : K) * ldb; }
  size_t c_elems() const { return static_cast<size_t>(M) * ldc; }
};

// The library calls of one training micro-batch, as Gpt2Model makes them: weights are
// stored [in, out], forward x W is N N, backward-data dY W^T is N T, backward-weight
// X^T dY is T N and accumulates. The tied head is wte [V, C] with logits rows of
// stride Vp (padded vocabulary); per chunk of rows: logits = x wte^T, dx = dlogits wte,
// dwte += dlogits^T x.
std::vector<Call> step_calls(const shardlm::ModelConfig& config, int B, int T, int chunk_rows) {
  const int C = config.n_embd, rows = B * T, V = config.vocab_size;
  const int Vp = config.padded_vocab_size();
  const long L = config.n_layer;
  std::vector<Call> calls;
  auto linear = [&](const std::string& name, int in, int out) {
    calls.push_back({name + " fwd", false, false, rows, out, in, in, out, out, 0.0f, L});
    calls.push_back({name + " bwd-data", false, true, rows, in, out, out, out, in, 0.0f, L});
    calls.push_back({name + " bwd-weight", true, false, in, out, rows, in, out, out, 1.0f, L});
  };
  linear("c_attn", C, 3 * C);
  linear("attn.c_proj", C, C);
  linear("c_fc", C, 4 * C);
  linear("mlp.c_proj", 4 * C, C);
  auto head = [&](int r, long count) {
    const std::string tag = fmt::format("lm_head/{}", r);
    calls.push_back({tag + " fwd", false, true, r, V, C, C, C, Vp, 0.0f, count});
    calls.push_back({tag + " bwd-data", false, false, r, C, V, Vp, C, C, 0.0f, count});
    calls.push_back({tag + " bwd-weight", true, false, V, C, r, Vp, C, C, 1.0f, count});
  };
  if (rows / chunk_rows > 0) head(chunk_rows, rows / chunk_rows);
  if (rows % chunk_rows > 0) head(rows % chunk_rows, 1);
  return calls;
}

// The model's own LM-head chunking (Gpt2Model::logits_chunk_rows) for this batch.
int model_chunk_rows(const shardlm::ModelConfig& config, int B, int T, DType precision) {
  shardlm::MemoryTracker tracker;
  const auto layout = shardlm::ParamLayout::build(config, 1);
  shardlm::ModelOptions options;
  options.precision = precision;
  const shardlm::Gpt2Model model(config, layout, B, T, options, tracker);
  return model.logits_chunk_rows();
}

// prepare (untimed) runs before every timed run.
double median_seconds(const std::function<void()>& run, double min_time,
                      const std::function<void()>& prepare) {
  prepare();
  Stopwatch warm;
  run();
  const double first = warm.seconds();
  const int reps = std::clamp(static_cast<int>(min_time / std::max(first, 1e-7)), 3, 200);
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
  app.add_option("--model", preset, "model preset");
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
    const shardlm::ModelConfig config = shardlm::model_preset(preset);
    const DType precision = shardlm::parse_dtype(precision_name, "--precision");
    omp_set_num_threads(threads);
    const int chunk_rows = model_chunk_rows(config, B, T, precision);
    const std::vector<Call> calls = step_calls(config, B, T, chunk_rows);

    size_t na = 0, nb = 0, nc = 0;
    for (const auto& c : calls) {
      na = std::max(na, c.a_elems());
      nb = std::max(nb, c.b_elems());
      nc = std::max(nc, c.c_elems());
    }
    const Operand a(precision, na, 1), b(precision, nb, 2);
    const Operand c(DType::fp32, nc, 3);

    CacheFlusher flush(static_cast<size_t>(flush_mb * (1 << 20)));
    const std::function<void()> keep_caches = [] {};
    std::vector<double> best(calls.size(), 1e30), best_cold(calls.size(), 1e30);
    std::vector<bool> quiet(calls.size(), false);
    for (int pass = 0; pass < passes; ++pass)
      for (size_t i = 0; i < calls.size(); ++i) {
        const Call& s = calls[i];
        const auto run = [&] {
          shardlm::cpu::gemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f,
                             shardlm::ConstTypedPtr(a.buffer.data(), precision), s.lda,
                             shardlm::ConstTypedPtr(b.buffer.data(), precision), s.ldb,
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
      shapes.push_back({{"name", s.name},
                        {"op", fmt::format("{}{}", s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N')},
                        {"M", s.M}, {"N", s.N}, {"K", s.K}, {"calls", s.calls},
                        {"gflops", s.flops() / best[i] * 1e-9},
                        {"cold_gflops", s.flops() / best_cold[i] * 1e-9}, {"quiet", quiet[i]}});
    }
    const double C = config.n_embd;
    const double attention_flops = 6.0 * C * T * (T + 1.0) * B * config.n_layer;
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
