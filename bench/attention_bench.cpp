// Times one layer's causal attention kernels (forward, backward) alone, on random
// inputs of a GPT-2 layer's shape, and prints the median ms of each and GFLOP/s on the
// visible pairs' matmul FLOPs (forward 2 C T (T + 1) per sequence, backward twice that),
// and a hash of the outputs' bits (out, lse, dqkv) to tell bitwise-neutral changes apart.
//   attention_bench [dtype=bf16|fp32] [B=1] [T=1024] [C=768] [H=12] [threads=2] [reps=15]
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "quiet_machine.hpp"
#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/timer.hpp"

int main(int argc, char** argv) {
  using namespace shardlm;
  const std::string dtype_arg = argc > 1 ? argv[1] : "bf16";
  const int B = argc > 2 ? std::atoi(argv[2]) : 1;
  const int T = argc > 3 ? std::atoi(argv[3]) : 1024;
  const int C = argc > 4 ? std::atoi(argv[4]) : 768;
  const int H = argc > 5 ? std::atoi(argv[5]) : 12;
  const int threads = argc > 6 ? std::atoi(argv[6]) : 2;
  const int reps = argc > 7 ? std::atoi(argv[7]) : 15;
  const bool bf16 = dtype_arg == "bf16";
  const DType dtype = bf16 ? DType::bf16 : DType::fp32;
  omp_set_num_threads(threads);

  const size_t qkv_n = static_cast<size_t>(B) * T * 3 * C;
  const size_t out_n = static_cast<size_t>(B) * T * C;
  Rng rng(7);
  std::vector<float> qkv32(qkv_n), dout(out_n), out32(out_n), dqkv(qkv_n);
  std::vector<float> lse(static_cast<size_t>(B) * H * T);
  // Scores of a trained layer are O(1): q, k ~ N(0, 1) keep q.k / sqrt(hd) there.
  for (float& x : qkv32) x = static_cast<float>(rng.normal());
  for (float& x : dout) x = 0.01f * static_cast<float>(rng.normal());
  std::vector<uint16_t> qkv16(qkv_n), out16(out_n);
  for (size_t i = 0; i < qkv_n; ++i) qkv16[i] = float_to_bf16(qkv32[i]);
  const ConstTypedPtr qkv = bf16 ? ConstTypedPtr{qkv16.data(), dtype}
                                      : ConstTypedPtr{qkv32.data(), dtype};
  const TypedPtr out = bf16 ? TypedPtr{out16.data(), dtype}
                                 : TypedPtr{out32.data(), dtype};
  const ConstTypedPtr out_c{out.data, dtype};

  bench::wait_until_quiet(20.0);
  std::vector<double> fwd, bwd;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    Stopwatch f;
    cpu::attention_forward(out, lse.data(), qkv, B, T, C, H);
    const double fwd_ms = f.millis();
    Stopwatch g;
    cpu::attention_backward(dqkv.data(), dout.data(), qkv, out_c, lse.data(), B, T, C, H);
    const double bwd_ms = g.millis();
    if (rep > 0) {
      fwd.push_back(fwd_ms);
      bwd.push_back(bwd_ms);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // FNV-1a over the bytes of the results.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  };
  mix(out.data, out_n * (bf16 ? 2 : 4));
  mix(lse.data(), lse.size() * sizeof(float));
  mix(dqkv.data(), dqkv.size() * sizeof(float));
  const double flops_fwd = 2.0 * C * T * (T + 1.0) * B;
  const double fwd_ms = median(fwd), bwd_ms = median(bwd);
  std::printf(
      "%s B=%d T=%d C=%d H=%d threads=%d: fwd %.2f ms (%.0f GFLOP/s), bwd %.2f ms (%.0f GFLOP/s), "
      "total %.2f ms; min fwd %.2f bwd %.2f; hash %016llx; load %s\n",
      dtype_arg.c_str(), B, T, C, H, threads, fwd_ms, flops_fwd / fwd_ms * 1e-6, bwd_ms,
      2 * flops_fwd / bwd_ms * 1e-6, fwd_ms + bwd_ms, *std::min_element(fwd.begin(), fwd.end()),
      *std::min_element(bwd.begin(), bwd.end()), static_cast<unsigned long long>(hash),
      bench::load_average().c_str());
  return 0;
}
