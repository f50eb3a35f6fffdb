#include "shardlm/plan/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <random>
#include <vector>

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/parallel/owned_params.hpp"
#include "shardlm/plan/run_plan.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm {

namespace {

// The least disturbed of several timings (the machine may be shared).
double fastest(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}

// A rate from a count and the time it took; a phase too short to time (< 1 us) gets
// a rate that makes its work free rather than a division by zero.
double rate(double amount, double seconds) {
  if (amount <= 0) return 1e18;
  return amount / std::max(seconds, 1e-6);
}

}  // namespace

ComputeCalibration measure_compute(const ModelConfig& config, int micro_batch, int seq_len,
                                   DType precision, int repeats) {
  SHARDLM_CHECK(repeats >= 1, "calibrate: --repeats must be at least 1, got {}", repeats);
  const ParamLayout layout = ParamLayout::build(config, 1);
  const ModelFamily& family = model_family(config.family);
  auto model = family.make_model(config, layout, micro_batch, seq_len, {precision, false},
                                 MemoryTracker::global());
  SingleProcessCommunicator comm;
  StrategyOptions options;
  options.kind = StrategyKind::ddp;
  options.param_dtype = precision;
  FlatUnitStrategy strategy(layout, model->unit_needs(), comm, options);
  ModelRunner runner(*model, strategy);
  for (int u = 0; u < layout.num_units(); ++u) {
    init_owned_params(*model, u, 1337, strategy.owned(u));
  }
  strategy.after_load();
  AdamWOptimizer optimizer(layout, strategy, AdamWConfig{});

  const size_t n = static_cast<size_t>(micro_batch) * static_cast<size_t>(seq_len);
  std::vector<int32_t> tokens(n), targets(n);
  std::mt19937 random(7);
  std::uniform_int_distribution<int32_t> id(0, config.vocab_size - 1);
  for (size_t i = 0; i < n; ++i) tokens[i] = id(random), targets[i] = id(random);
  const MicroBatch batch{tokens.data(), targets.data(), micro_batch, seq_len};

  // What the plan counts for this same run (one rank, ddp).
  RunPlanRequest request;
  request.config = config;
  request.micro_batch = micro_batch;
  request.seq_len = seq_len;
  request.model.precision = precision;
  request.strategy = options;
  const RunPlan plan = plan_run(request);
  ComputeWork work;
  for (const auto& w : plan.unit_work) work += w.forward, work += w.backward;
  const double adamw_bytes = adamw_state_bytes(static_cast<double>(plan.parameters),
                                               precision == DType::bf16);

  std::vector<double> best(kNumPhases, std::numeric_limits<double>::infinity());
  double best_step = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= repeats; ++i) {  // the first is a warm-up
    take_phase_totals();
    Stopwatch clock;
    strategy.begin_step(1);
    runner.forward(batch, true, 1.0f / static_cast<float>(n));
    runner.backward(batch, 0);
    strategy.finish_gradients();
    optimizer.step(1e-5f, 1.0f, i + 1);
    strategy.after_step();
    const double seconds = clock.seconds();
    const PhaseTotals phases = take_phase_totals();
    if (i == 0) continue;
    best_step = std::min(best_step, seconds);
    for (int p = 0; p < kNumPhases; ++p)
      best[static_cast<size_t>(p)] = std::min(best[static_cast<size_t>(p)], phases.seconds[p]);
  }
  strategy.synchronize();
  const auto phase = [&](Phase p) { return best[static_cast<size_t>(p)]; };
  ComputeCalibration out;
  out.rates.gemm_flops_per_s = rate(work.gemm_flops, phase(Phase::gemm));
  out.rates.attention_flops_per_s = rate(work.attention_flops, phase(Phase::attention));
  out.rates.elementwise_bytes_per_s =
      rate(work.elementwise_bytes, phase(Phase::norms_elementwise));
  out.rates.loss_bytes_per_s = rate(work.loss_bytes, phase(Phase::loss));
  out.rates.state_bytes_per_s = rate(adamw_bytes, phase(Phase::optimizer));
  out.step_seconds = best_step;
  return out;
}

namespace {

struct Timing {
  double small_s = 0, large_s = 0;
};

// Fits t = latency x messages + bus / bandwidth through the small and large timings.
CollectiveRate fit(double m_small, double b_small, double t_small, double m_large, double b_large,
                   double t_large) {
  CollectiveRate r;
  const double det = m_small * b_large - m_large * b_small;
  const double latency = det != 0 ? (t_small * b_large - t_large * b_small) / det : 0;
  r.latency_s = std::max(0.0, latency);
  r.bus_bytes_per_s = b_large / std::max(t_large - r.latency_s * m_large, 1e-9);
  return r;
}

}  // namespace

TransportCalibration measure_transport(Communicator& world, const std::string& name,
                                       size_t large_bytes, int repeats) {
  const int N = world.size();
  SHARDLM_CHECK(N >= 2, "calibrate: collectives need at least 2 ranks, got {}", N);
  SHARDLM_CHECK(repeats >= 1, "calibrate: --repeats must be at least 1, got {}", repeats);
  // Sizes in floats, a multiple of N so every rank's block is whole.
  const size_t large = std::max<size_t>(N, large_bytes / 4 / N * N);
  const size_t small = static_cast<size_t>(N) * 1024;  // 4 KiB per rank
  TrackedBuffer buffer(MemCategory::other, large * 4);
  float* data = buffer.as<float>();
  std::fill(data, data + large, 1.0f);
  TrackedBuffer received(MemCategory::other, large * 4);  // all-to-all and send/recv: no in-place
  float* other = received.as<float>();
  std::fill(other, other + large, 0.0f);
  const int r = world.rank();
  const int next = (r + 1) % N, prev = (r + N - 1) % N;

  const auto time_once = [&](CollectiveKind kind, size_t count) {
    world.barrier("calibrate barrier").wait();
    Stopwatch clock;
    const size_t block = count / static_cast<size_t>(N);
    switch (kind) {
      case CollectiveKind::all_gather:
        world.all_gather(data + r * block, data, block, "calibrate all_gather").wait();
        break;
      case CollectiveKind::reduce_scatter:
        world.reduce_scatter(data, data + r * block, block, ReduceOp::sum,
                             "calibrate reduce_scatter")
            .wait();
        break;
      case CollectiveKind::all_to_all:
        world.all_to_all(data, other, block, "calibrate all_to_all").wait();
        break;
      case CollectiveKind::send_recv:  // one ring step: the whole buffer to the next rank
        world.send_recv(data, count, next, other, count, prev, "calibrate send_recv").wait();
        break;
      default:
        world.all_reduce(data, count, ReduceOp::sum, "calibrate all_reduce").wait();
        break;
    }
    double seconds = clock.seconds();
    // Every rank uses the slowest rank's time (the collective is as slow as it).
    world.all_reduce_blocking(std::span<double>(&seconds, 1), ReduceOp::max, "calibrate time");
    return seconds;
  };
  const auto fastest_of = [&](CollectiveKind kind, size_t count) {
    time_once(kind, count);  // warm-up: first touch, connection set-up
    std::vector<double> t;
    for (int i = 0; i < repeats; ++i) t.push_back(time_once(kind, count));
    return fastest(t);
  };

  TransportCalibration out;
  out.figures.name = name;
  const CollectiveKind kinds[] = {CollectiveKind::all_gather, CollectiveKind::reduce_scatter,
                                  CollectiveKind::all_reduce, CollectiveKind::all_to_all,
                                  CollectiveKind::send_recv};
  double large_all_reduce_s = 0;
  for (CollectiveKind kind : kinds) {
    const double small_bytes = 4.0 * small, large_b = 4.0 * large;
    const double t_small = fastest_of(kind, small), t_large = fastest_of(kind, large);
    const auto bus = [&](double bytes) {
      return static_cast<double>(bus_bytes_for(kind, static_cast<uint64_t>(bytes), N));
    };
    // Messages as the step model counts them (the exchanges: a fixed number).
    const auto messages = [&](double bytes) {
      return collective_messages(kind, bytes, N, CommOptions{}.scratch_bytes, 4);
    };
    const CollectiveRate rate =
        fit(messages(small_bytes), bus(small_bytes), t_small, messages(large_b), bus(large_b), t_large);
    switch (kind) {
      case CollectiveKind::all_gather: out.figures.all_gather = rate; break;
      case CollectiveKind::reduce_scatter: out.figures.reduce_scatter = rate; break;
      case CollectiveKind::all_to_all: out.figures.all_to_all = rate; break;
      case CollectiveKind::send_recv: out.figures.send_recv = rate; break;
      default: out.figures.all_reduce = rate; break;
    }
    if (kind == CollectiveKind::all_reduce) large_all_reduce_s = t_large;
    out.detail += fmt::format("{} {:.1f} KiB {:.3f} ms, {:.1f} MiB {:.2f} ms -> {:.1f} us/message, "
                              "{:.2f} GB/s bus; ",
                              to_string(kind), small_bytes / 1024, t_small * 1e3,
                              large_b / (1 << 20), t_large * 1e3, rate.latency_s * 1e6,
                              rate.bus_bytes_per_s / 1e9);
  }

  // Overlap: a GEMM loop about twice as long as the large all-reduce, alone and with
  // the all-reduce in flight beside it: share = (compute + comm - both) / comm.
  constexpr int kM = 256, kN = 1024, kK = 1024;
  TrackedBuffer a(MemCategory::other, size_t{kM} * kK * 4), b(MemCategory::other, size_t{kK} * kN * 4),
      c(MemCategory::other, size_t{kM} * kN * 4);
  std::fill(a.as<float>(), a.as<float>() + kM * kK, 0.5f);
  std::fill(b.as<float>(), b.as<float>() + kK * kN, 0.25f);
  const auto gemms = [&](int count) {
    Stopwatch clock;
    for (int i = 0; i < count; ++i)
      cpu::sgemm(false, false, kM, kN, kK, 1.0f, a.as<float>(), kK, b.as<float>(), kN, 0.0f,
                 c.as<float>(), kN);
    return clock.seconds();
  };
  gemms(2);
  double one = gemms(4) / 4;
  world.all_reduce_blocking(std::span<double>(&one, 1), ReduceOp::max, "calibrate gemm time");
  const int count = std::max(1, static_cast<int>(std::ceil(2 * large_all_reduce_s / one)));
  std::vector<double> alone, both;
  for (int i = 0; i < std::max(3, repeats); ++i) {
    world.barrier("calibrate barrier").wait();
    double times[2] = {gemms(count), 0};
    world.barrier("calibrate barrier").wait();
    Stopwatch clock;
    Work w = world.all_reduce(data, large, ReduceOp::sum, "calibrate overlap");
    gemms(count);
    w.wait();
    times[1] = clock.seconds();
    world.all_reduce_blocking(std::span<double>(times, 2), ReduceOp::max, "calibrate overlap time");
    alone.push_back(times[0]);
    both.push_back(times[1]);
  }
  const double share =
      (fastest(alone) + large_all_reduce_s - fastest(both)) / large_all_reduce_s;
  out.figures.compute_share_during_comm = std::clamp(share, 0.05, 1.0);
  out.detail += fmt::format("overlap: gemm loop {:.1f} ms, share of compute speed during a "
                            "collective {:.2f}",
                            count * one * 1e3, out.figures.compute_share_during_comm);
  return out;
}

}  // namespace shardlm
