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
// `ring` times ring attention's block kernels instead (attention_block.hpp: forward,
// backward, log-sum-exp merge) on one batch row of Q_LEN queries over KV_LEN keys, with
// every query seeing every key ("all": a block from earlier in the row) and with the
// causal prefix (query i sees keys [0, i]: a rank's own block); GFLOP/s on the visible
// pairs as above:
//   attention_bench ring DTYPE Q_LEN KV_LEN N_HEAD N_KV_HEAD HEAD_DIM [threads=2] [reps=9]
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "quiet_machine.hpp"
#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/attention_block.hpp"
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

// FNV-1a over the bytes of results, to tell bitwise-neutral changes apart.
constexpr uint64_t kFnvStart = 1469598103934665603ull;
void fnv1a(uint64_t& hash, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
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
  uint64_t hash = kFnvStart;
  fnv1a(hash, out.data, out_n * dtype_bytes(row.dtype));
  fnv1a(hash, lse.data(), lse.size() * sizeof(float));
  fnv1a(hash, dqkv.data(), dqkv.size() * sizeof(float));
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

// Ring attention's block kernels on one batch row (the `ring` mode): for each key
// pattern, the median ms of the forward, the backward and the merge, and GFLOP/s of
// forward and backward on the visible pairs (forward 4 n_head hd per pair).
void time_ring_blocks(DType dtype, const AttentionBlockShape& s, int threads, int reps) {
  const bool bf16 = dtype == DType::bf16;
  const int64_t queries = int64_t(s.B) * s.q_len, ld_q = s.q_columns();
  const size_t q_n = size_t(queries * ld_q), kv_n = size_t(int64_t(s.B) * s.kv_len * s.kv_columns());
  const size_t lse_n = size_t(s.B) * s.n_head * s.q_len;
  Rng rng(7);
  std::vector<float> q32(q_n), kv32(kv_n), dout(q_n), out(q_n), out2(q_n), dq(q_n), dkv(kv_n);
  std::vector<float> lse(lse_n), lse2(lse_n);
  for (float& x : q32) x = static_cast<float>(rng.normal());
  for (float& x : kv32) x = static_cast<float>(rng.normal());
  for (float& x : dout) x = 0.01f * static_cast<float>(rng.normal());
  std::vector<uint16_t> q16(q_n), kv16(kv_n), out16(q_n);
  for (size_t i = 0; i < q_n; ++i) q16[i] = float_to_bf16(q32[i]);
  for (size_t i = 0; i < kv_n; ++i) kv16[i] = float_to_bf16(kv32[i]);
  const ConstTypedPtr q = bf16 ? ConstTypedPtr{q16.data(), dtype} : ConstTypedPtr{q32.data(), dtype};
  const ConstTypedPtr kv = bf16 ? ConstTypedPtr{kv16.data(), dtype} : ConstTypedPtr{kv32.data(), dtype};
  std::printf("ring attention blocks, %s, %d queries x %d keys, heads %d:%d, hd %d, %d threads\n",
              std::string(dtype_name(dtype)).c_str(), s.q_len, s.kv_len, s.n_head, s.n_kv_head,
              s.head_dim, threads);
  std::printf("| keys | fwd ms | fwd GFLOP/s | bwd ms | bwd GFLOP/s | merge ms | hash |\n|---|---|---|---|---|---|---|\n");
  for (const bool causal : {false, true}) {
    std::vector<int32_t> range;
    double pairs = 0;
    for (int64_t i = 0; i < queries; ++i) {
      const int end = causal ? std::min<int>(s.kv_len, int(i % s.q_len) + 1) : s.kv_len;
      range.push_back(0);
      range.push_back(end);
      pairs += end;
    }
    const double fwd_flops = 4.0 * s.n_head * s.head_dim * pairs;
    bench::wait_until_quiet(20.0);
    std::vector<double> fwd, bwd, merge;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      Stopwatch f;
      cpu::attention_block_forward(out.data(), lse.data(), q, ld_q, kv, s, range.data());
      const double fwd_ms = f.millis();
      cpu::attention_block_forward(out2.data(), lse2.data(), q, ld_q, kv, s, range.data());
      Stopwatch m;
      cpu::attention_lse_merge(out.data(), lse.data(), out2.data(), lse2.data(), s);
      const double merge_ms = m.millis();
      for (size_t i = 0; i < q_n; ++i) out16[i] = float_to_bf16(out[i]);
      const ConstTypedPtr stored = bf16 ? ConstTypedPtr{out16.data(), dtype} : ConstTypedPtr{out.data(), dtype};
      std::fill(dq.begin(), dq.end(), 0.0f);
      std::fill(dkv.begin(), dkv.end(), 0.0f);
      Stopwatch g;
      cpu::attention_block_backward(dq.data(), dkv.data(), dout.data(), stored, lse.data(), q, ld_q, kv, s,
                                    range.data());
      const double bwd_ms = g.millis();
      if (rep > 0) {
        fwd.push_back(fwd_ms);
        bwd.push_back(bwd_ms);
        merge.push_back(merge_ms);
      }
    }
    uint64_t hash = kFnvStart;
    fnv1a(hash, out.data(), q_n * sizeof(float));
    fnv1a(hash, lse.data(), lse_n * sizeof(float));
    fnv1a(hash, dq.data(), q_n * sizeof(float));
    fnv1a(hash, dkv.data(), kv_n * sizeof(float));
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2f | %016llx |\n", causal ? "causal" : "all",
                median(fwd), fwd_flops / median(fwd) * 1e-6, median(bwd), 2 * fwd_flops / median(bwd) * 1e-6,
                median(merge), static_cast<unsigned long long>(hash));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "ring") {
    if (argc < 8) {
      std::fprintf(stderr, "usage: attention_bench ring DTYPE Q_LEN KV_LEN N_HEAD N_KV_HEAD HEAD_DIM "
                           "[threads] [reps]\n");
      return 2;
    }
    const int threads = argc > 8 ? std::atoi(argv[8]) : 2;
    omp_set_num_threads(threads);
    time_ring_blocks(parse_dtype(argv[2], "DTYPE"),
                     {1, std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]),
                      std::atoi(argv[7])},
                     threads, argc > 9 ? std::atoi(argv[9]) : 9);
    std::printf("load %s\n", bench::load_average().c_str());
    return 0;
  }
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
