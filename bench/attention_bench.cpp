// Times one layer's causal attention kernels (forward, backward) alone, on random
// inputs of the attention shapes of GPT-2 124M (12 heads), SmolLM2-135M (9 query heads,
// 3 kv heads) and Qwen2.5-0.5B (14 query heads, 2 kv heads), all head_dim 64, at
// B x T = 1 x 1024 and 8 x 256, fp32 and bf16. Prints per row the median ms of each
// kernel and GFLOP/s on the visible query-key pairs' matmul FLOPs (forward
// 2 n_head head_dim T (T + 1) per sequence: QK^T and PV; backward twice that: dP, dV,
// dQ, dK; the backward's score recompute not counted), so GQA compares with GPT-2's
// multi-head kernel per FLOP, and a hash of the outputs' bits (out, lse, dqkv) to tell
// bitwise-neutral changes apart.
//   attention_bench [threads=2] [reps=9] [row filter, e.g. "qwen" or "fp32"]
//   attention_bench custom DTYPE B T N_HEAD N_KV_HEAD HEAD_DIM [threads=2] [reps=9]
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

namespace {

using namespace shardlm;

struct Row {
  std::string model;
  cpu::AttentionShape shape;
  DType dtype;
};

struct Timing {
  double fwd_ms, bwd_ms, min_fwd_ms, min_bwd_ms;
  uint64_t hash;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Timing time_row(const Row& row, int reps) {
  const cpu::AttentionShape& s = row.shape;
  const bool bf16 = row.dtype == DType::bf16;
  const size_t qkv_n = static_cast<size_t>(s.B) * s.T * s.qkv_columns();
  const size_t out_n = static_cast<size_t>(s.B) * s.T * s.out_columns();
  Rng rng(7);
  std::vector<float> qkv32(qkv_n), dout(out_n), out32(out_n), dqkv(qkv_n);
  std::vector<float> lse(static_cast<size_t>(s.B) * s.n_head * s.T);
  // Scores of a trained layer are O(1): q, k ~ N(0, 1) keep q.k / sqrt(hd) there.
  for (float& x : qkv32) x = static_cast<float>(rng.normal());
  for (float& x : dout) x = 0.01f * static_cast<float>(rng.normal());
  std::vector<uint16_t> qkv16(qkv_n), out16(out_n);
  for (size_t i = 0; i < qkv_n; ++i) qkv16[i] = float_to_bf16(qkv32[i]);
  const ConstTypedPtr qkv =
      bf16 ? ConstTypedPtr{qkv16.data(), row.dtype} : ConstTypedPtr{qkv32.data(), row.dtype};
  const TypedPtr out = bf16 ? TypedPtr{out16.data(), row.dtype} : TypedPtr{out32.data(), row.dtype};

  bench::wait_until_quiet(20.0);
  std::vector<double> fwd, bwd;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    Stopwatch f;
    cpu::attention_forward(out, lse.data(), qkv, s);
    const double fwd_ms = f.millis();
    Stopwatch g;
    cpu::attention_backward(dqkv.data(), dout.data(), qkv, out, lse.data(), s);
    const double bwd_ms = g.millis();
    if (rep > 0) {
      fwd.push_back(fwd_ms);
      bwd.push_back(bwd_ms);
    }
  }
  // FNV-1a over the bytes of the results.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  };
  mix(out.data, out_n * dtype_bytes(row.dtype));
  mix(lse.data(), lse.size() * sizeof(float));
  mix(dqkv.data(), dqkv.size() * sizeof(float));
  return {median(fwd), median(bwd), *std::min_element(fwd.begin(), fwd.end()),
          *std::min_element(bwd.begin(), bwd.end()), hash};
}

void print_header(int threads) {
  std::printf("attention, one layer, %d threads; GFLOP/s on model FLOPs (fwd 2 n_head hd T(T+1) B, "
              "bwd twice that)\n",
              threads);
  std::printf("| model | heads q:kv | hd | B x T | dtype | path | fwd ms | fwd GFLOP/s | bwd ms | "
              "bwd GFLOP/s | total ms | min fwd / bwd ms | hash |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

void print_row(const Row& row, const Timing& t) {
  const cpu::AttentionShape& s = row.shape;
  const double flops_fwd = 2.0 * s.n_head * s.head_dim * s.T * (s.T + 1.0) * s.B;
  const bool dot = row.dtype == DType::bf16 && cpu::attention_uses_bf16_dot_products(s);
  std::printf("| %s | %d:%d | %d | %d x %d | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f / "
              "%.1f | %016llx |\n",
              row.model.c_str(), s.n_head, s.n_kv_head, s.head_dim, s.B, s.T,
              std::string(dtype_name(row.dtype)).c_str(),
              row.dtype == DType::fp32 ? "fp32" : dot ? "bf16 dot" : "widen", t.fwd_ms,
              flops_fwd / t.fwd_ms * 1e-6, t.bwd_ms, 2 * flops_fwd / t.bwd_ms * 1e-6,
              t.fwd_ms + t.bwd_ms, t.min_fwd_ms, t.min_bwd_ms,
              static_cast<unsigned long long>(t.hash));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool custom = argc > 1 && std::string(argv[1]) == "custom";
  if (custom && argc < 8) {
    std::fprintf(stderr, "usage: attention_bench custom DTYPE B T N_HEAD N_KV_HEAD HEAD_DIM "
                         "[threads] [reps]\n");
    return 2;
  }
  const int first_option = custom ? 8 : 1;
  const int threads = argc > first_option ? std::atoi(argv[first_option]) : 2;
  const int reps = argc > first_option + 1 ? std::atoi(argv[first_option + 1]) : 9;
  omp_set_num_threads(threads);

  std::vector<Row> rows;
  if (custom) {
    rows.push_back({"custom",
                    {std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]),
                     std::atoi(argv[7])},
                    parse_dtype(argv[2], "DTYPE")});
  } else {
    const std::string filter = argc > 3 ? argv[3] : "";
    struct Model {
      const char* name;
      int n_head, n_kv_head, head_dim;
    };
    for (const Model m : {Model{"gpt2", 12, 12, 64}, Model{"smollm2-135m", 9, 3, 64},
                          Model{"qwen2.5-0.5b", 14, 2, 64}})
      for (const auto& [B, T] : {std::pair{1, 1024}, std::pair{8, 256}})
        for (const DType dtype : {DType::fp32, DType::bf16}) {
          const Row row{m.name, {B, T, m.n_head, m.n_kv_head, m.head_dim}, dtype};
          const std::string label = row.model + " " + std::string(dtype_name(dtype));
          if (label.find(filter) != std::string::npos) rows.push_back(row);
        }
  }
  print_header(threads);
  for (const Row& row : rows) print_row(row, time_row(row, reps));
  std::printf("load %s\n", bench::load_average().c_str());
  return 0;
}
