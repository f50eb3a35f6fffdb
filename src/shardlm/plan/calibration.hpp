// Measurements behind `shardlm calibrate`: this machine's compute rates on a model's
// own kernels, and a transport's collective latency, bandwidth and overlap. Every
// rank of a job measures at once, so the figures include what ranks side by side
// cost each other (shared cores, caches, memory bandwidth).
#pragma once

#include <string>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/plan/hardware_profile.hpp"

namespace shardlm {

struct ComputeCalibration {
  ComputeRates rates;
  double step_seconds = 0;  // forward + backward + optimizer of one micro-batch, measured
};

// Trains `repeats` micro-batches of random tokens (after one warm-up) through the real
// model, strategy and optimizer on this rank alone, reads the phase profile
// (core/phase_profile.hpp) and divides the planned FLOPs and bytes of each kind of
// work (plan/unit_work.hpp conventions) by the fastest time measured for it.
ComputeCalibration measure_compute(const ModelConfig& config, int micro_batch, int seq_len,
                                   DType precision, int repeats);

struct TransportCalibration {
  TransportFigures figures;
  // The timings the fit came from: per kind, small and large message, seconds.
  std::string detail;
};

// Times all-gather, reduce-scatter, all-reduce, all-to-all (equal splits) and a ring
// step of send_recv (the buffer to the next rank, from the previous) on `world` at
// two sizes (small:
// latency, large_bytes: bandwidth; the fastest of `repeats`, as the machine may be
// shared), fits latency per message and
// bus bandwidth (t = latency x messages + bus bytes / bandwidth, messages as the step
// model counts them), and measures how fast a GEMM loop runs while a large all-reduce
// is in flight. Collective; every rank returns the same figures (rank 0's).
TransportCalibration measure_transport(Communicator& world, const std::string& name,
                                       size_t large_bytes, int repeats);

}  // namespace shardlm
