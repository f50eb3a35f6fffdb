// Times one training micro-batch (forward of every unit, fused head + loss, backward)
// of a GPT-2 preset on the CPU, per unit, and prints a table.
//   gpt2_step_bench [preset=gpt2-small-30m] [B=8] [T=256] [threads=2] [steps=3]
#include <omp.h>

#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "gpt2-small-30m";
  const int B = argc > 2 ? std::atoi(argv[2]) : 8;
  const int T = argc > 3 ? std::atoi(argv[3]) : 256;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 3;
  omp_set_num_threads(threads);

  const shardlm::ModelConfig config = shardlm::model_preset(preset);
  const auto layout = shardlm::ParamLayout::build(config, 1);
  shardlm::Gpt2Model model(config, layout, B, T);
  const int U = model.num_units();
  std::vector<shardlm::TrackedBuffer> params, grads;
  std::vector<float*> param_ptrs, grad_ptrs;
  for (int u = 0; u < U; ++u) {
    const size_t bytes = layout.units[u].padded_numel * sizeof(float);
    params.emplace_back(shardlm::MemCategory::params, bytes);
    grads.emplace_back(shardlm::MemCategory::grads, bytes);
    model.init_unit(u, 1234, params.back().as<float>());
    param_ptrs.push_back(params.back().as<float>());
    grad_ptrs.push_back(grads.back().as<float>());
  }
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  shardlm::Rng rng(1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng.below(config.vocab_size));
    targets[i] = static_cast<int32_t>(rng.below(config.vocab_size));
  }
  const shardlm::MicroBatch batch{tokens.data(), targets.data(), B, T};
  const float scale = 1.0f / static_cast<float>(tokens.size());

  std::printf("%s, B=%d T=%d, %d threads, GEMM %s\n", preset.c_str(), B, T, threads,
              shardlm::cpu::gemm_library_name());
  std::vector<double> fwd(U), bwd(U);
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up
    shardlm::Stopwatch total;
    const std::clock_t cpu_start = std::clock();
    for (int u = 0; u < U; ++u) {
      shardlm::Stopwatch w;
      model.forward_unit(u, param_ptrs, grad_ptrs, batch, true, scale);
      if (step > 0) fwd[u] += w.seconds() / steps;
    }
    for (int u = U - 1; u >= 0; --u) {
      shardlm::Stopwatch w;
      model.backward_unit(u, param_ptrs, grad_ptrs, batch);
      if (step > 0) bwd[u] += w.seconds() / steps;
    }
    const double s = total.seconds();
    // CPU time of all threads: on a shared machine wall time also counts the time a
    // thread waited for a core.
    const double cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    std::printf("step %d: %.3f s wall, %.3f s cpu (%.0f tok/s, %.1f GFLOP/s model), loss %.4f\n",
                step, s, cpu, B * T / s, config.train_flops_per_token(T) * B * T / s / 1e9,
                model.last_loss_sum() / static_cast<double>(B * T));
  }
  std::printf("%-12s %10s %10s\n", "unit", "fwd ms", "bwd ms");
  double f = 0, b = 0;
  for (int u = 0; u < U; ++u) {
    std::printf("%-12s %10.1f %10.1f\n", layout.units[u].name.c_str(), fwd[u] * 1e3, bwd[u] * 1e3);
    f += fwd[u];
    b += bwd[u];
  }
  std::printf("%-12s %10.1f %10.1f   (final fwd includes the fused head's gradient GEMMs)\n",
              "total", f * 1e3, b * 1e3);
  return 0;
}
