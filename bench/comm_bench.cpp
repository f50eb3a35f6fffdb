// Collective timings on this machine: Open MPI's own collectives against shardlm's
// rank-order algorithms (comm/mpi_algorithms.hpp) and the full queued path
// (MpiCommunicator: queue + communication thread). Sizes are nccl-tests "algorithm
// bytes" (all_reduce: the buffer; reduce_scatter: the send buffer; all_gather: the
// receive buffer; all_to_all: the send buffer; send_recv: the message one rank sends
// while receiving as much, one ring step); bus GB/s = bus bytes / time (counters.hpp).
// A latency table follows: the median time of one tiny exchange (8 bytes per peer).
//
//   mpirun -n 2 build/bench/comm_bench [--sizes-mib 1,4,16,64] [--reps 10]
//          [--scratch-mib 1,4,16] [--library-only] [--overlap]
// --overlap: how much of an all-reduce hides behind computation on the compute thread
// (compute alone, all-reduce alone, both at once). --start-on-wait: the queued path
// with CommOptions::overlap = false (collectives start when waited for).
// Library algorithm settings come from the environment or mpirun flags, e.g.
//   --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_reduce_scatter_block_algorithm 3
// and are printed in the header. Each time is the slowest rank's, median over reps.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "shardlm/comm/launch.hpp"
#include "shardlm/comm/mpi_algorithms.hpp"
#include "shardlm/comm/mpi_communicator.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/timer.hpp"

extern char** environ;

namespace {

using namespace shardlm;

std::vector<double> parse_list(const std::string& text) {
  std::vector<double> values;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    values.push_back(std::stod(text.substr(start, end - start)));
    start = end + 1;
  }
  return values;
}

struct Args {
  std::vector<double> sizes_mib = {1, 4, 16, 64};
  std::vector<double> scratch_mib = {1, 4, 16};
  int reps = 10;
  bool library_only = false;
  bool overlap = false;
  bool start_on_wait = false;
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--sizes-mib" && has_value)
      args.sizes_mib = parse_list(argv[++i]);
    else if (a == "--scratch-mib" && has_value)
      args.scratch_mib = parse_list(argv[++i]);
    else if (a == "--reps" && has_value)
      args.reps = std::atoi(argv[++i]);
    else if (a == "--library-only")
      args.library_only = true;
    else if (a == "--overlap")
      args.overlap = true;
    else if (a == "--start-on-wait")
      args.start_on_wait = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  return args;
}

// Median over reps of the slowest rank's time; `sync` and `slowest` are supplied by
// the caller so the queued section can avoid calling MPI from the main thread.
double time_median_ms(int reps, const std::function<void()>& run, const std::function<void()>& sync,
                      const std::function<double(double)>& slowest) {
  run();  // warm-up: first touch of library temporaries, connection set-up
  sync();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    sync();
    Stopwatch watch;
    run();
    times.push_back(slowest(watch.millis()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void print_row(int rank, const char* collective, const std::string& variant, double size_mib,
               double ms, uint64_t bus_bytes) {
  if (rank != 0) return;
  std::printf("| %-14s | %-34s | %7.3f | %9.3f | %6.2f |\n", collective, variant.c_str(), size_mib,
              ms, bus_bytes / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
}

// Stand-in for backward: FMAs on an L1-resident array, no memory traffic.
// noinline: an opaque call, so the compiler cannot move the work across the clock reads.
__attribute__((noinline)) float compute_for(long iterations) {
  alignas(64) float acc[64];
  for (int i = 0; i < 64; ++i) acc[i] = 1.0f + i * 1e-3f;
  for (long it = 0; it < iterations; ++it)
    for (int i = 0; i < 64; ++i) acc[i] = acc[i] * 0.9999999f + 1e-7f;
  float sum = 0;
  for (float x : acc) sum += x;
  return sum;
}

std::string allowed_cpus() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return "?";
  char line[256];
  std::string out = "?";
  while (std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, "Cpus_allowed_list:", 18) == 0) {
      out = line + 18;
      out.erase(0, out.find_first_not_of(" \t"));
      out.erase(out.find_last_not_of(" \n") + 1);
    }
  std::fclose(f);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  if (rank == 0) {
    const LaunchEnvironment env = probe_launch_environment();
    std::printf("comm_bench: %d ranks, thread level %d, %d physical cores, CMA single copy %s\n", n,
                provided, env.physical_cores, env.single_copy_works ? "works" : "refused");
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "OMPI_MCA_coll", 13) == 0 || std::strncmp(*e, "OMPI_MCA_btl", 12) == 0 ||
          std::strncmp(*e, "MALLOC_", 7) == 0 || std::strncmp(*e, "GLIBC_TUNABLES", 14) == 0)
        std::printf("  env %s\n", *e);
    std::printf(
        "\n| collective     | variant                            |     MiB |    ms     | bus GB/s "
        "|\n");
    std::printf("|---|---|---|---|---|\n");
  }

  const double max_mib = *std::max_element(args.sizes_mib.begin(), args.sizes_mib.end());
  const size_t max_floats = static_cast<size_t>(max_mib * (1 << 20)) / sizeof(float);
  TrackedBuffer a(MemCategory::comm, max_floats * sizeof(float));
  TrackedBuffer b(MemCategory::comm, max_floats * sizeof(float));
  const double max_scratch = *std::max_element(args.scratch_mib.begin(), args.scratch_mib.end());
  TrackedBuffer scratch(MemCategory::comm, static_cast<size_t>(max_scratch * (1 << 20)));
  float* data = a.as<float>();
  float* other = b.as<float>();
  for (size_t i = 0; i < max_floats; ++i) data[i] = other[i] = static_cast<float>(rank + 1);

  auto sync = [] { MPI_Barrier(MPI_COMM_WORLD); };
  auto slowest = [](double ms) {
    double out = 0;
    MPI_Allreduce(&ms, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
  };
  auto scratch_of = [&](double mib) {
    return mpi::Scratch{scratch.as<float>(), static_cast<size_t>(mib * (1 << 20)) / sizeof(float)};
  };

  for (double mib : args.sizes_mib) {
    const size_t count = static_cast<size_t>(mib * (1 << 20)) / sizeof(float) / n * n;
    const size_t block = count / n;
    const uint64_t bytes = count * sizeof(float);
    const uint64_t ar_bus = bus_bytes_for(CollectiveKind::all_reduce, bytes, n);
    const uint64_t rs_bus = bus_bytes_for(CollectiveKind::reduce_scatter, bytes, n);
    const int int_count = static_cast<int>(count);
    const int int_block = static_cast<int>(block);

    print_row(rank, "all_reduce", "MPI_Allreduce", mib,
              time_median_ms(
                  args.reps,
                  [&] {
                    MPI_Allreduce(MPI_IN_PLACE, data, int_count, MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD);
                  },
                  sync, slowest),
              ar_bus);
    print_row(rank, "reduce_scatter", "MPI_Reduce_scatter_block", mib,
              time_median_ms(
                  args.reps,
                  [&] {
                    MPI_Reduce_scatter_block(data, other, int_block, MPI_FLOAT, MPI_SUM,
                                             MPI_COMM_WORLD);
                  },
                  sync, slowest),
              rs_bus);
    print_row(rank, "all_gather", "MPI_Allgather (in place)", mib,
              time_median_ms(
                  args.reps,
                  [&] {
                    MPI_Allgather(MPI_IN_PLACE, int_block, MPI_FLOAT, data, int_block, MPI_FLOAT,
                                  MPI_COMM_WORLD);
                  },
                  sync, slowest),
              rs_bus);
    const uint64_t a2a_bus = bus_bytes_for(CollectiveKind::all_to_all, bytes, n);
    const int block_bytes = static_cast<int>(block * sizeof(float));
    print_row(rank, "all_to_all", "MPI_Alltoall", mib,
              time_median_ms(
                  args.reps,
                  [&] {
                    MPI_Alltoall(data, block_bytes, MPI_BYTE, other, block_bytes, MPI_BYTE,
                                 MPI_COMM_WORLD);
                  },
                  sync, slowest),
              a2a_bus);
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    print_row(rank, "send_recv", "MPI_Sendrecv (ring step)", mib,
              time_median_ms(
                  args.reps,
                  [&] {
                    MPI_Sendrecv(data, int_count, MPI_FLOAT, next, 1, other, int_count, MPI_FLOAT,
                                 prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                  },
                  sync, slowest),
              bus_bytes_for(CollectiveKind::send_recv, bytes, n));
    if (args.library_only) continue;

    {
      const std::vector<size_t> per_peer(n, block * sizeof(float));
      print_row(rank, "all_to_all", "direct exchange", mib,
                time_median_ms(
                    args.reps,
                    [&] {
                      mpi::all_to_all_v(MPI_COMM_WORLD, data, per_peer.data(), other,
                                        per_peer.data());
                    },
                    sync, slowest),
                a2a_bus);
      print_row(rank, "send_recv", "Irecv + Isend (ring step)", mib,
                time_median_ms(
                    args.reps,
                    [&] {
                      mpi::send_recv(MPI_COMM_WORLD, data, bytes, next, other, bytes, prev);
                    },
                    sync, slowest),
                bus_bytes_for(CollectiveKind::send_recv, bytes, n));
    }

    for (double s : args.scratch_mib) {
      const std::string tag =
          " (chunk " + std::to_string(static_cast<int>(s * 1024 / std::max(1, n - 1))) + " KiB)";
      print_row(rank, "all_reduce", "rank-order RS+AG" + tag, mib,
                time_median_ms(
                    args.reps,
                    [&] {
                      mpi::all_reduce_rank_order(MPI_COMM_WORLD, data, count, ReduceOp::sum,
                                                 scratch_of(s));
                    },
                    sync, slowest),
                ar_bus);
      print_row(rank, "reduce_scatter", "rank-order direct" + tag, mib,
                time_median_ms(
                    args.reps,
                    [&] {
                      mpi::reduce_scatter_rank_order(MPI_COMM_WORLD, data, other, block,
                                                     ReduceOp::sum, scratch_of(s));
                    },
                    sync, slowest),
                rs_bus);
    }
    // Small buffers: one all-gather + local reduction against reduce-scatter +
    // all-gather (what kSmallAllReduceBytes chooses between).
    const mpi::Scratch big_scratch = scratch_of(max_scratch);
    if (count * n <= big_scratch.floats)
      print_row(rank, "all_reduce", "rank-order by gathering", mib,
                time_median_ms(
                    args.reps,
                    [&] {
                      mpi::all_reduce_rank_order(MPI_COMM_WORLD, data, count, ReduceOp::sum,
                                                 big_scratch, SIZE_MAX);
                    },
                    sync, slowest),
                ar_bus);
    print_row(rank, "all_reduce", "rank-order RS+AG (no gathering)", mib,
              time_median_ms(
                  args.reps,
                  [&] {
                    mpi::all_reduce_rank_order(MPI_COMM_WORLD, data, count, ReduceOp::sum,
                                               big_scratch, 0);
                  },
                  sync, slowest),
              ar_bus);
    for (double chunk_mib : {1.0, 64.0}) {
      print_row(rank, "all_gather",
                "direct p2p (chunk " + std::to_string(static_cast<int>(chunk_mib)) + " MiB)", mib,
                time_median_ms(
                    args.reps,
                    [&] {
                      mpi::all_gather_direct(MPI_COMM_WORLD, data + rank * block, data,
                                             block * sizeof(float),
                                             static_cast<size_t>(chunk_mib * (1 << 20)));
                    },
                    sync, slowest),
                rs_bus);
    }
  }

  if (!args.library_only) {
    // The whole path a trainer uses: enqueue on the compute thread, run on the
    // communication thread, wait. From here on only that thread calls MPI.
    CommOptions options;
    options.scratch_bytes = size_t{4} << 20;  // the default
    options.overlap = !args.start_on_wait;
    auto world = MpiCommunicator::create_world(options);
    auto queued_sync = [&] { world->barrier("sync").wait(); };
    auto queued_slowest = [&](double ms) {
      std::vector<double> v = {ms};
      world->all_reduce_blocking(v, ReduceOp::max, "slowest");
      return v[0];
    };
    for (double mib : args.sizes_mib) {
      const size_t count = static_cast<size_t>(mib * (1 << 20)) / sizeof(float) / n * n;
      const size_t block = count / n;
      const uint64_t bytes = count * sizeof(float);
      print_row(
          rank, "all_reduce", "MpiCommunicator (queued)", mib,
          time_median_ms(
              args.reps, [&] { world->all_reduce(data, count, ReduceOp::sum, "bench").wait(); },
              queued_sync, queued_slowest),
          bus_bytes_for(CollectiveKind::all_reduce, bytes, n));
      print_row(
          rank, "reduce_scatter", "MpiCommunicator (queued)", mib,
          time_median_ms(
              args.reps,
              [&] { world->reduce_scatter(data, other, block, ReduceOp::sum, "bench").wait(); },
              queued_sync, queued_slowest),
          bus_bytes_for(CollectiveKind::reduce_scatter, bytes, n));
      print_row(
          rank, "all_gather", "MpiCommunicator (queued)", mib,
          time_median_ms(
              args.reps,
              [&] { world->all_gather(data + world->rank() * block, data, block, "bench").wait(); },
              queued_sync, queued_slowest),
          bus_bytes_for(CollectiveKind::all_gather, bytes, n));
      print_row(rank, "all_to_all", "MpiCommunicator (queued)", mib,
                time_median_ms(
                    args.reps, [&] { world->all_to_all(data, other, block, "bench").wait(); },
                    queued_sync, queued_slowest),
                bus_bytes_for(CollectiveKind::all_to_all, bytes, n));
      // Uneven splits (expert dispatch), balanced so every rank sends and receives the
      // whole buffer: rank p sends rank q the share (p + q) % n + 1 of n (n + 1) / 2.
      std::vector<size_t> share(n), send_counts(n), recv_counts(n);
      size_t assigned = 0;
      for (int k = 0; k < n; ++k) {
        share[k] = k + 1 < n ? count * (k + 1) / (n * (n + 1) / 2) : count - assigned;
        assigned += share[k];
      }
      for (int q = 0; q < n; ++q) {
        send_counts[q] = share[(world->rank() + q) % n];
        recv_counts[q] = share[(q + world->rank()) % n];
      }
      uint64_t sent_away = 0;
      for (int q = 0; q < n; ++q)
        if (q != world->rank()) sent_away += send_counts[q] * sizeof(float);
      print_row(rank, "all_to_all_v", "MpiCommunicator (queued, uneven)", mib,
                time_median_ms(
                    args.reps,
                    [&] {
                      world->all_to_all_v(data, send_counts, other, recv_counts, "bench").wait();
                    },
                    queued_sync, queued_slowest),
                sent_away);
      const int next = (world->rank() + 1) % n, prev = (world->rank() + n - 1) % n;
      print_row(rank, "send_recv", "MpiCommunicator (queued, ring step)", mib,
                time_median_ms(
                    args.reps,
                    [&] { world->send_recv(data, count, next, other, count, prev, "bench").wait(); },
                    queued_sync, queued_slowest),
                bus_bytes_for(CollectiveKind::send_recv, bytes, n));
    }
    // Latency: one tiny exchange (8 bytes per peer), queued path, median microseconds.
    const double a2a_us =
        1e3 * time_median_ms(
                  std::max(args.reps, 50),
                  [&] { world->all_to_all(data, other, 2, "latency").wait(); }, queued_sync,
                  queued_slowest);
    const int next = (world->rank() + 1) % n, prev = (world->rank() + n - 1) % n;
    const double ring_us =
        1e3 * time_median_ms(
                  std::max(args.reps, 50),
                  [&] { world->send_recv(data, 2, next, other, 2, prev, "latency").wait(); },
                  queued_sync, queued_slowest);
    const double barrier_us =
        1e3 * time_median_ms(
                  std::max(args.reps, 50), [&] { world->barrier("latency").wait(); },
                  queued_sync, queued_slowest);
    if (rank == 0)
      std::printf("\nlatency (MpiCommunicator, 8 bytes per peer, median of %d): all_to_all %.1f us, "
                  "send_recv ring step %.1f us, barrier %.1f us\n",
                  std::max(args.reps, 50), a2a_us, ring_us, barrier_us);
    if (args.overlap) {
      // Calibrate a compute block of about the 16 MiB all-reduce's own duration.
      const size_t count = (size_t{16} << 20) / sizeof(float) / n * n;
      volatile float sink = 0;
      const double comm_ms = time_median_ms(
          args.reps, [&] { world->all_reduce(data, count, ReduceOp::sum, "overlap").wait(); },
          queued_sync, queued_slowest);
      long iterations = 10000;
      for (int round = 0; round < 6; ++round) {  // scale until one block takes ~comm_ms
        Stopwatch block;
        sink = sink + compute_for(iterations);
        iterations = std::max(1L, static_cast<long>(iterations * comm_ms / block.millis()));
      }
      const double compute_ms = time_median_ms(
          args.reps, [&] { sink = sink + compute_for(iterations); }, queued_sync, queued_slowest);
      double exposed_ms = 0;
      const double both_ms = time_median_ms(
          args.reps,
          [&] {
            Work w = world->all_reduce(data, count, ReduceOp::sum, "overlap");
            sink = sink + compute_for(iterations);
            Stopwatch waiting;
            w.wait();
            exposed_ms = waiting.millis();
          },
          queued_sync, queued_slowest);
      if (rank == 0)
        std::printf(
            "\n%s (rank 0 CPUs %s): 16 MiB all_reduce alone %.2f ms, compute alone %.2f ms, "
            "both %.2f ms (last wait %.2f ms); hidden %.0f%% of the all-reduce\n",
            args.start_on_wait ? "start on wait" : "overlap", allowed_cpus().c_str(), comm_ms,
            compute_ms, both_ms, exposed_ms, 100.0 * (comm_ms + compute_ms - both_ms) / comm_ms);
    }
    world->finalize();
  }
  MPI_Finalize();
  return 0;
}
