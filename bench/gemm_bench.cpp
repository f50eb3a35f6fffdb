// gemm_bench: oneDNN against OpenBLAS on the GEMM shapes of one training step of
// gpt2-small-30m and gpt2 (124M), so shardlm's GEMM library is a measured choice
// (docs/gemm.md).
//
// For every shape (forward x W, backward-data dY W^T and backward-weight X^T dY of
// each linear layer, the tied LM head whole and in 256-row chunks, the per-head
// attention products) it prints GFLOP/s of each library at 1 and 2 threads: the
// median of several timed runs after a warm-up, on buffers allocated and touched
// once. "step GEMM s" sums median time x calls per step.
//
// OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded, so the "alt" OpenBLAS
// columns come from a child process (this binary re-executed) with that variable
// flipped: unset if it was set, Haswell if it was not.
//
// usage: gemm_bench [--models small,124m] [--min-time SECONDS] [--passes N]
//                   [--quiet-wait SECONDS] [--no-alt] [--primitive] [--no-extras]
//   --quiet-wait waits up to that long before each timed block for other processes
//                to go idle (the machine is shared); figures marked * were not quiet
//   --primitive  adds oneDNN's matmul primitive (created once per shape) at 1 and 2 threads
//   --no-extras  skips the per-call overhead and GEMM-then-OpenMP-kernel sections
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "quiet_machine.hpp"
#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/core/timer.hpp"

namespace {

using shardlm::bench::load_average;
using shardlm::bench::wait_until_quiet;

using shardlm::Stopwatch;
using shardlm::cpu::GemmLibrary;

struct GemmShape {
  std::string model;
  std::string name;
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  int lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  long count = 1;  // calls per training step
  // The LM head runs either whole or chunked: each belongs to one of the two step totals.
  enum class Head { kNone, kFull, kChunked } head = Head::kNone;

  double flops() const { return 2.0 * M * N * K; }
  size_t a_elems() const { return static_cast<size_t>(trans_a ? K : M) * lda; }
  size_t b_elems() const { return static_cast<size_t>(trans_b ? N : K) * ldb; }
  size_t c_elems() const { return static_cast<size_t>(M) * ldc; }
};

struct ModelShape {
  std::string name;
  int n_layer, n_head, n_embd, batch, seq_len, vocab;
};

const std::vector<ModelShape> kModels = {
    {"small", 6, 6, 384, 8, 256, 50304},     // gpt2-small-30m, B*T = 2048
    {"124m", 12, 12, 768, 1, 1024, 50304},   // gpt2 124M, B*T = 1024
};
constexpr int kHeadChunkRows = 256;

// The GEMMs of one training step. Linear weights are stored [in, out] (Hugging Face
// Conv1D); the tied LM head is wte [V, C]; backward-weight GEMMs accumulate (beta 1).
std::vector<GemmShape> step_shapes(const ModelShape& m) {
  std::vector<GemmShape> s;
  const int C = m.n_embd, BT = m.batch * m.seq_len, T = m.seq_len, hd = C / m.n_head;
  const long L = m.n_layer;
  auto add = [&](std::string name, bool ta, bool tb, int M, int N, int K, int lda, int ldb,
                 int ldc, float beta, long count, GemmShape::Head head = GemmShape::Head::kNone) {
    s.push_back({m.name, std::move(name), ta, tb, M, N, K, lda, ldb, ldc, 1.0f, beta, count, head});
  };
  auto linear = [&](const std::string& name, int in, int out) {
    add(name + " fwd", false, false, BT, out, in, in, out, out, 0.0f, L);
    add(name + " bwd-data", false, true, BT, in, out, out, out, in, 0.0f, L);
    add(name + " bwd-weight", true, false, in, out, BT, in, out, out, 1.0f, L);
  };
  linear("c_attn", C, 3 * C);
  linear("attn.c_proj", C, C);
  linear("c_fc", C, 4 * C);
  linear("mlp.c_proj", 4 * C, C);
  auto head = [&](const std::string& name, int rows, long count, GemmShape::Head kind) {
    add(name + " fwd", false, true, rows, m.vocab, C, C, C, m.vocab, 0.0f, count, kind);
    add(name + " bwd-data", false, false, rows, C, m.vocab, m.vocab, C, C, 0.0f, count, kind);
    add(name + " bwd-weight", true, false, m.vocab, C, rows, m.vocab, C, C, 1.0f, count, kind);
  };
  head("lm_head", BT, 1, GemmShape::Head::kFull);
  head(fmt::format("lm_head/{}", kHeadChunkRows), kHeadChunkRows, BT / kHeadChunkRows,
       GemmShape::Head::kChunked);
  // Attention per (batch, head): q, k, v are column blocks of the [T, 3C] qkv rows,
  // the head output and its gradient are column blocks of [T, C] rows.
  const long per_head = static_cast<long>(m.batch) * m.n_head * L;
  add("att Q K^T", false, true, T, T, hd, 3 * C, 3 * C, T, 0.0f, per_head);
  add("att P V", false, false, T, hd, T, T, 3 * C, C, 0.0f, per_head);
  add("att dO V^T", false, true, T, T, hd, C, 3 * C, T, 0.0f, per_head);
  add("att P^T dO", true, false, T, hd, T, T, C, 3 * C, 0.0f, per_head);
  add("att dS K", false, false, T, hd, T, T, 3 * C, 3 * C, 0.0f, per_head);
  add("att dS^T Q", true, false, T, hd, T, T, 3 * C, 3 * C, 0.0f, per_head);
  for (auto& shape : s) shape.alpha = shape.name == "att Q K^T" ? 1.0f / std::sqrt(hd) : 1.0f;
  return s;
}

// Median of timed runs after one warm-up call; at least 3 runs, more for fast shapes.
double median_seconds(const std::function<void()>& run, double min_time) {
  Stopwatch warm;
  run();
  const double first = warm.seconds();
  const int reps = std::clamp(static_cast<int>(min_time / std::max(first, 1e-7)), 3, 200);
  std::vector<double> times(reps);
  for (auto& t : times) {
    Stopwatch sw;
    run();
    t = sw.seconds();
  }
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[reps / 2];
}

// Buffers for the largest shape, allocated and touched once (first touch is slow here).
struct Buffers {
  std::vector<float> a, b, c;
  explicit Buffers(const std::vector<GemmShape>& shapes) {
    size_t na = 0, nb = 0, nc = 0;
    for (const auto& s : shapes) {
      na = std::max(na, s.a_elems());
      nb = std::max(nb, s.b_elems());
      nc = std::max(nc, s.c_elems());
    }
    shardlm::Rng rng(1234);
    auto fill = [&](std::vector<float>& v, size_t n) {
      v.resize(n);
      for (auto& x : v) x = static_cast<float>(rng.uniform() - 0.5) * 0.1f;
    };
    fill(a, na);
    fill(b, nb);
    fill(c, nc);
  }
};

double time_sgemm(GemmLibrary lib, int threads, const GemmShape& s, Buffers& buf,
                  double min_time) {
  omp_set_num_threads(threads);  // sgemm_on gives OpenBLAS the same count
  return median_seconds(
      [&] {
        shardlm::cpu::sgemm_on(lib, s.trans_a, s.trans_b, s.M, s.N, s.K, s.alpha, buf.a.data(),
                               s.lda, buf.b.data(), s.ldb, s.beta, buf.c.data(), s.ldc);
      },
      min_time);
}

// oneDNN's matmul primitive, created once per shape and thread count (outside the
// timing), to see whether a primitive cache would beat dnnl_sgemm.
double time_matmul_primitive(int threads, const GemmShape& s, Buffers& buf, double min_time,
                             std::string* impl) {
  using dnnl::memory;
  omp_set_num_threads(threads);
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const auto f32 = memory::data_type::f32;
  memory::desc a_md({s.M, s.K}, f32,
                    s.trans_a ? memory::dims{1, s.lda} : memory::dims{s.lda, 1});
  memory::desc b_md({s.K, s.N}, f32,
                    s.trans_b ? memory::dims{1, s.ldb} : memory::dims{s.ldb, 1});
  memory::desc c_md({s.M, s.N}, f32, memory::dims{s.ldc, 1});
  dnnl::primitive_attr attr;
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
  } catch (const dnnl::error&) {
    *impl = "unimplemented";
    return -1.0;
  }
  *impl = pd.impl_info_str();
  dnnl::matmul matmul(pd);
  memory a_mem(a_md, engine, buf.a.data()), b_mem(b_md, engine, buf.b.data()),
      c_mem(c_md, engine, buf.c.data());
  return median_seconds(
      [&] {
        matmul.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem},
                                {DNNL_ARG_DST, c_mem}});
        stream.wait();
      },
      min_time);
}

struct Options {
  std::vector<ModelShape> models;
  double min_time = 0.3;  // seconds of timed runs per shape and column, over all passes
  int passes = 3;
  double quiet_wait = 20.0;  // seconds to wait for other processes to go idle per block
  bool alt = true;
  bool primitive = false;
  bool extras = true;
  bool child = false;  // re-executed: time OpenBLAS only, print "R row threads seconds"
};

Options parse(int argc, char** argv) {
  Options o;
  std::string models = "small,124m";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gemm_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--models") models = value();
    else if (arg == "--min-time") o.min_time = std::stod(value());
    else if (arg == "--passes") o.passes = std::max(1, std::stoi(value()));
    else if (arg == "--quiet-wait") o.quiet_wait = std::stod(value());
    else if (arg == "--no-alt") o.alt = false;
    else if (arg == "--primitive") o.primitive = true;
    else if (arg == "--no-extras") o.extras = false;
    else if (arg == "--child-openblas") o.child = true;
    else {
      std::fprintf(stderr,
                   "gemm_bench: unknown argument %s\nusage: gemm_bench [--models small,124m] "
                   "[--min-time S] [--passes N] [--quiet-wait S] [--no-alt] [--primitive] [--no-extras]\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  std::stringstream list(models);
  for (std::string name; std::getline(list, name, ',');) {
    auto it = std::find_if(kModels.begin(), kModels.end(),
                           [&](const ModelShape& m) { return m.name == name; });
    if (it == kModels.end()) {
      std::fprintf(stderr, "gemm_bench: unknown model %s; expected small or 124m\n", name.c_str());
      std::exit(2);
    }
    o.models.push_back(*it);
  }
  return o;
}

std::string self_path() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  path[n] = '\0';
  return path;
}


// OpenBLAS columns from a child process with OPENBLAS_CORETYPE flipped.
// Returns (row, threads) -> seconds, and the child's OpenBLAS core name.
struct Cell {
  double seconds = -1.0;
  bool loaded = false;
};

std::map<std::pair<int, int>, Cell> run_alt_child(const Options& o, std::string* env_desc,
                                                    std::string* corename) {
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const std::string env_prefix =
      coretype ? "env -u OPENBLAS_CORETYPE" : "env OPENBLAS_CORETYPE=Haswell";
  *env_desc = coretype ? "OPENBLAS_CORETYPE unset" : "OPENBLAS_CORETYPE=Haswell";
  std::string models;
  for (const auto& m : o.models) models += (models.empty() ? "" : ",") + m.name;
  const std::string cmd =
      fmt::format("{} '{}' --child-openblas --models {} --min-time {} --passes {} --quiet-wait {}",
                  env_prefix, self_path(), models, o.min_time, o.passes, o.quiet_wait);
  std::map<std::pair<int, int>, Cell> result;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return result;
  char line[512];
  while (std::fgets(line, sizeof(line), pipe)) {
    int row = 0, threads = 0, loaded = 0;
    double seconds = 0;
    char name[256];
    if (std::sscanf(line, "R %d %d %lf %d", &row, &threads, &seconds, &loaded) == 4) {
      result[{row, threads}] = {seconds, loaded != 0};
    } else if (std::sscanf(line, "CORE %255s", name) == 1) {
      *corename = name;
    }
  }
  pclose(pipe);
  return result;
}

std::string gflops_cell(const GemmShape& s, double seconds, bool loaded) {
  if (seconds <= 0) return "-";
  return fmt::format("{:.0f}{}", s.flops() / seconds * 1e-9, loaded ? "*" : "");
}

struct Column {
  std::string header;
  // Median seconds of a block of runs lasting about `block` seconds.
  std::function<double(const GemmShape&, double block, std::string* impl)> time;
};


// Each shape is timed on every column in turn, in several passes; a column's figure
// is its best block median over the passes. Other work on this shared machine only
// ever slows a block down, and the columns of one shape are measured within moments
// of each other, so they see the same machine. `loaded` marks figures whose best
// block began while other processes were busy.
std::vector<std::vector<double>> measure(const std::vector<GemmShape>& shapes,
                                         const std::vector<Column>& columns, const Options& o,
                                         std::vector<std::string>* impl,
                                         std::vector<std::vector<bool>>* loaded) {
  std::vector<std::vector<double>> best(shapes.size(),
                                        std::vector<double>(columns.size(), 1e30));
  loaded->assign(shapes.size(), std::vector<bool>(columns.size(), false));
  std::string unused;
  for (size_t i = 0; i < shapes.size(); ++i)
    for (int pass = 0; pass < o.passes; ++pass)
      for (size_t c = 0; c < columns.size(); ++c) {
        const bool quiet = wait_until_quiet(o.quiet_wait);
        const double t =
            columns[c].time(shapes[i], o.min_time / o.passes, impl ? &(*impl)[i] : &unused);
        if (t <= 0) {
          best[i][c] = -1.0;
        } else if (t < best[i][c]) {
          best[i][c] = t;
          (*loaded)[i][c] = !quiet;
        }
      }
  return best;
}

// Per-call overhead: tiny GEMMs, microseconds per call.
void print_overhead(double min_time, double quiet_wait) {
  std::printf("\n## Per-call cost of tiny GEMMs (us per call, median)\n\n");
  std::printf("| M x N x K | oneDNN 1t | oneDNN 2t | OpenBLAS 1t | OpenBLAS 2t |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int n : {1, 8, 32, 64}) {
    GemmShape s{"", "tiny", false, false, n, n, n, n, n, n, 1.0f, 0.0f, 1, GemmShape::Head::kNone};
    Buffers buf({s});
    std::printf("| %d x %d x %d |", n, n, n);
    for (GemmLibrary lib : {GemmLibrary::kOneDnn, GemmLibrary::kOpenBlas})
      for (int t : {1, 2}) {
        wait_until_quiet(quiet_wait);
        std::printf(" %.2f |", time_sgemm(lib, t, s, buf, min_time) * 1e6);
      }
    std::printf("\n");
  }
}

// A GEMM followed by an OpenMP elementwise kernel on its output, as a training step
// does: shows whether the GEMM library's threads fight shardlm's OpenMP threads.
void print_interleaved(double min_time, double quiet_wait) {
  const GemmShape s{"small", "c_fc fwd", false, false, 2048, 1536, 384, 384, 1536, 1536,
                    1.0f, 0.0f, 1, GemmShape::Head::kNone};
  Buffers buf({s});
  const long n = static_cast<long>(s.M) * s.N;
  auto kernel = [&] {
    float* c = buf.c.data();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) {
      const float x = c[i];  // GELU (tanh), as the MLP applies after c_fc
      c[i] = 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
  };
  auto best_of_passes = [&](const std::function<void()>& run) {
    double best = 1e30;
    for (int pass = 0; pass < 3; ++pass) {
      wait_until_quiet(quiet_wait);
      best = std::min(best, median_seconds(run, min_time / 3));
    }
    return best;
  };
  std::printf("\n## GEMM then OpenMP kernel, 2 threads (c_fc fwd 2048x1536x384, then GELU)\n\n");
  std::printf("| library | GEMM alone ms | GELU alone ms | GEMM+GELU ms | extra ms |\n");
  std::printf("|---|---|---|---|---|\n");
  omp_set_num_threads(2);
  const double gelu = best_of_passes(kernel);
  for (GemmLibrary lib : {GemmLibrary::kOneDnn, GemmLibrary::kOpenBlas}) {
    auto gemm_call = [&] {
      shardlm::cpu::sgemm_on(lib, false, false, s.M, s.N, s.K, 1.0f, buf.a.data(), s.lda,
                             buf.b.data(), s.ldb, 0.0f, buf.c.data(), s.ldc);
    };
    const double gemm = best_of_passes(gemm_call);
    const double both = best_of_passes([&] {
      gemm_call();
      kernel();
    });
    std::printf("| %s | %.2f | %.2f | %.2f | %+.2f |\n", shardlm::cpu::gemm_library_name(lib),
                gemm * 1e3, gelu * 1e3, both * 1e3, (both - gemm - gelu) * 1e3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<GemmShape> shapes;
  for (const auto& m : o.models) {
    auto s = step_shapes(m);
    shapes.insert(shapes.end(), s.begin(), s.end());
  }
  Buffers buf(shapes);

  if (o.child) {
    std::printf("CORE %s\n", openblas_get_corename());
    std::vector<Column> columns;
    for (int t : {1, 2})
      columns.push_back({"", [t, &buf](const GemmShape& s, double block, std::string*) {
                           return time_sgemm(GemmLibrary::kOpenBlas, t, s, buf, block);
                         }});
    std::vector<std::vector<bool>> loaded;
    const auto sec = measure(shapes, columns, o, nullptr, &loaded);
    for (size_t i = 0; i < shapes.size(); ++i)
      for (int t : {1, 2})
        std::printf("R %zu %d %.9g %d\n", i, t, sec[i][t - 1], loaded[i][t - 1] ? 1 : 0);
    return 0;
  }

  const dnnl_version_t* v = dnnl_version();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("# gemm_bench\n\n");
  std::printf("- oneDNN %d.%d.%d (cpu runtime 0x%x = %s), effective ISA 0x%x\n", v->major,
              v->minor, v->patch, v->cpu_runtime, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other",
              static_cast<unsigned>(dnnl_get_effective_cpu_isa()));
  std::printf("- OpenBLAS: %s; core %s; OPENBLAS_CORETYPE=%s (as given)\n", openblas_get_config(),
              openblas_get_corename(), coretype ? coretype : "(unset)");
  std::printf("- sgemm default library: %s; load average at start: %s\n",
              shardlm::cpu::gemm_library_name(), load_average().c_str());
  std::printf("- GFLOP/s: per shape and column, the best over %d passes of the median of >= 3 "
              "runs after a warm-up (~%.2f s of runs in all); 1t/2t = threads\n",
              o.passes, o.min_time);

  // Columns: oneDNN 1t 2t, OpenBLAS 1t 2t, [primitive 1t 2t], then [alt OpenBLAS 1t 2t]
  // from the child process.
  std::vector<Column> columns;
  for (GemmLibrary lib : {GemmLibrary::kOneDnn, GemmLibrary::kOpenBlas})
    for (int t : {1, 2})
      columns.push_back({fmt::format("{} {}t", shardlm::cpu::gemm_library_name(lib), t),
                         [lib, t, &buf](const GemmShape& s, double block, std::string*) {
                           return time_sgemm(lib, t, s, buf, block);
                         }});
  if (o.primitive)
    for (int t : {1, 2})
      columns.push_back({fmt::format("oneDNN matmul primitive {}t", t),
                         [t, &buf](const GemmShape& s, double block, std::string* impl) {
                           return time_matmul_primitive(t, s, buf, block, impl);
                         }});
  const size_t rows = shapes.size();
  std::vector<std::string> impl(rows);
  std::vector<std::vector<bool>> loaded;
  std::vector<std::vector<double>> sec = measure(shapes, columns, o, &impl, &loaded);
  std::vector<std::string> headers;
  for (const auto& c : columns) headers.push_back(c.header);
  if (o.alt) {
    std::string env_desc, corename = "?";
    const auto alt = run_alt_child(o, &env_desc, &corename);
    for (int t : {1, 2}) {
      headers.push_back(fmt::format("OpenBLAS {}t ({}, core {})", t, env_desc, corename));
      for (size_t i = 0; i < rows; ++i) {
        auto it = alt.find({static_cast<int>(i), t});
        sec[i].push_back(it == alt.end() ? -1.0 : it->second.seconds);
        loaded[i].push_back(it != alt.end() && it->second.loaded);
      }
    }
  }

  for (const auto& m : o.models) {
    std::printf("\n## %s: L=%d H=%d C=%d B=%d T=%d V=%d (B*T = %d)\n\n", m.name.c_str(), m.n_layer,
                m.n_head, m.n_embd, m.batch, m.seq_len, m.vocab, m.batch * m.seq_len);
    std::printf("| shape | tA tB | M x N x K | calls/step |");
    for (const auto& h : headers) std::printf(" %s |", h.c_str());
    if (o.primitive) std::printf(" primitive impl |");
    std::printf("\n|---|---|---|---|");
    for (size_t c = 0; c < headers.size() + (o.primitive ? 1 : 0); ++c) std::printf("---|");
    std::printf("\n");
    std::vector<double> total_chunked(headers.size(), 0.0), total_full(headers.size(), 0.0);
    for (size_t i = 0; i < rows; ++i) {
      const auto& s = shapes[i];
      if (s.model != m.name) continue;
      std::printf("| %s | %c %c | %d x %d x %d | %ld |", s.name.c_str(), s.trans_a ? 'T' : 'N',
                  s.trans_b ? 'T' : 'N', s.M, s.N, s.K, s.count);
      for (size_t c = 0; c < headers.size(); ++c) {
        std::printf(" %s |", gflops_cell(s, sec[i][c], loaded[i][c]).c_str());
        const double t = sec[i][c] * s.count;
        if (s.head != GemmShape::Head::kFull) total_chunked[c] += t;
        if (s.head != GemmShape::Head::kChunked) total_full[c] += t;
      }
      if (o.primitive) std::printf(" %s |", impl[i].c_str());
      std::printf("\n");
    }
    std::printf("| **step GEMM s, LM head in %d-row chunks** | | | |", kHeadChunkRows);
    for (double t : total_chunked) std::printf(" **%.3f** |", t);
    std::printf("\n| **step GEMM s, LM head whole** | | | |");
    for (double t : total_full) std::printf(" **%.3f** |", t);
    std::printf("\n");
  }
  if (o.extras) {
    print_overhead(o.min_time, o.quiet_wait);
    print_interleaved(o.min_time, o.quiet_wait);
  }
  std::printf("\n`*`: the best block of that figure began while other processes were busy "
              "(waited %.0f s for quiet, in vain).\n", o.quiet_wait);
  std::printf("load average at end: %s\n", load_average().c_str());
  return 0;
}
