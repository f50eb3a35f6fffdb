// `shardlm calibrate`: measures this machine for the step-time model and writes a
// hardware profile (plan/hardware_profile.hpp) that `plan`, `bench` and
// `train --strategy auto` read. It starts itself under mpirun once per transport
// (shared memory; TCP, or whatever --tcp-launcher starts); every rank measures at
// once, so the figures include what ranks side by side cost each other.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "shardlm/cli/commands.hpp"
#include "shardlm/comm/launch.hpp"
#include "shardlm/comm/world.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/subprocess.hpp"
#include "shardlm/plan/calibration.hpp"
#include "shardlm/plan/recommend.hpp"
#include "shardlm/train/thread_budget.hpp"

namespace fs = std::filesystem;

namespace shardlm::cli {
namespace {

struct CalibrateFlags {
  CalibrateFlags() { run.micro_batch = 4; }
  TrainOptions run;  // model and shape
  int ranks = 2;
  std::vector<std::string> precisions = {"fp32", "bf16"};
  std::vector<std::string> transports = {"shm", "tcp"};
  std::string tcp_launcher;
  std::string base;
  std::string out;
  std::string name = "this-machine";
  double large_mib = 16;
  int repeats = 2;
  bool skip_compute = false;
  double timeout = 1200;
  // Set by the parent for the ranks it starts.
  std::string worker_transport, worker_out;
};

// ---- worker: one rank of the measuring job ----

void run_worker(const CalibrateFlags& f) {
  auto world = make_world_communicator({});
  const int threads = plan_threads(*world, f.run.threads).threads;
  omp_set_num_threads(threads);
  nlohmann::json out = {{"ranks", world->size()}, {"threads_per_rank", threads}};
  try {
    if (!f.skip_compute) {
      const ModelConfig config = resolve_model_config(f.run, model_preset(f.run.model).vocab_size);
      for (const auto& p : f.precisions) {
        const ComputeCalibration c =
            measure_compute(config, f.run.micro_batch, f.run.seq_len, parse_dtype(p, "--precisions"),
                            f.repeats);
        // The slowest rank's rates: a step goes at its pace.
        double r[5] = {c.rates.gemm_flops_per_s, c.rates.attention_flops_per_s,
                       c.rates.elementwise_bytes_per_s, c.rates.loss_bytes_per_s,
                       c.rates.state_bytes_per_s};
        world->all_reduce_blocking(std::span<double>(r, 5), ReduceOp::min, "calibrate rates");
        out["compute"][p] = rates_to_json({r[0], r[1], r[2], r[3], r[4]});
        out["step_ms"][p] = c.step_seconds * 1e3;
      }
    }
    const TransportCalibration t =
        measure_transport(*world, f.worker_transport, static_cast<size_t>(f.large_mib * (1 << 20)),
                          f.repeats);
    out["transport"] = transport_to_json(t.figures);
    out["detail"] = t.detail;
  } catch (const std::exception& e) {
    world->abort_job(std::string("error: calibrate: ") + e.what());
  }
  if (world->rank() == 0) write_file_atomic(f.worker_out, out.dump(1) + "\n");
  world->finalize();
}

// ---- parent: start the workers, assemble the profile ----

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && model == "unknown CPU")
      model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = line;
  }
  const bool avx512 = flags.find(" avx512f") != std::string::npos;
  const bool bf16 = flags.find(" avx512_bf16") != std::string::npos;
  return fmt::format("{} ({} cores, {})", model, std::thread::hardware_concurrency(),
                     bf16 ? "AVX-512 + avx512_bf16" : avx512 ? "AVX-512" : "AVX2");
}

double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

nlohmann::json run_transport(const CalibrateFlags& f, const std::string& transport, bool compute,
                             const fs::path& work) {
  const fs::path result = work / (transport + ".json");
  std::vector<std::string> args = {self_executable(), "calibrate", "--model", f.run.model,
                                   "--micro-batch", std::to_string(f.run.micro_batch),
                                   "--seq-len", std::to_string(f.run.seq_len),
                                   "--precisions", fmt::format("{}", fmt::join(f.precisions, ",")),
                                   "--large-mib", fmt::format("{}", f.large_mib),
                                   "--repeats", std::to_string(f.repeats),
                                   "--worker-transport", transport,
                                   "--worker-out", result.string()};
  if (f.run.threads) args.insert(args.end(), {"--threads", std::to_string(*f.run.threads)});
  if (!compute) args.push_back("--skip-compute");
  std::vector<std::string> argv;
  if (transport == "tcp" && !f.tcp_launcher.empty()) {
    argv = split_words(f.tcp_launcher);
    argv.insert(argv.end(), args.begin(), args.end());
  } else {
    argv = mpirun_command(f.ranks, args);
    if (transport == "tcp") argv.insert(argv.begin() + 1, {"--mca", "btl", "tcp,self"});
  }
  const fs::path log = work / (transport + ".log");
  std::printf("calibrate: %s (%s%s)...\n", transport.c_str(),
              compute ? "compute on the model's kernels, then " : "", "collectives");
  std::fflush(stdout);
  const CommandResult r = run_command(argv, f.timeout, log.string());
  if (r.status != 0 || !fs::exists(result)) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    const std::string tail = text.str().substr(text.str().size() > 2000 ? text.str().size() - 2000 : 0);
    std::fprintf(stderr, "%s\n", tail.c_str());
    throw Error(fmt::format("calibrate: the {} measurement {} (command: {})", transport,
                            r.timed_out ? fmt::format("timed out after {} s", f.timeout)
                                        : fmt::format("failed with status {}", r.status),
                            command_line(argv)));
  }
  std::ifstream in(result);
  return nlohmann::json::parse(in);
}

void run_parent(const CalibrateFlags& f) {
  SHARDLM_CHECK(f.ranks >= 2, "-n must be at least 2 (collectives are measured between ranks), got {}",
                f.ranks);
  SHARDLM_CHECK(f.large_mib > 0, "--large-mib must be positive, got {}", f.large_mib);
  SHARDLM_CHECK(f.repeats >= 1, "--repeats must be at least 1, got {}", f.repeats);
  SHARDLM_CHECK(!f.transports.empty(), "--transports must name shm and/or tcp");
  for (const auto& t : f.transports)
    SHARDLM_CHECK(t == "shm" || t == "tcp", "--transports: unknown transport '{}' (expected shm or tcp)", t);
  for (const auto& p : f.precisions) parse_dtype(p, "--precisions");
  resolve_model_config(f.run, model_preset(f.run.model).vocab_size);  // names a bad --model early
  SHARDLM_CHECK(f.skip_compute ? !f.base.empty() : true,
                "--skip-compute needs --base PROFILE to take the compute figures from");
  HardwareProfile profile;
  if (!f.base.empty()) profile = load_profile(f.base);
  const std::string out = f.out.empty() ? default_profile_path() : f.out;

  const fs::path work = fs::temp_directory_path() / fmt::format("shardlm-calibrate-{}", getpid());
  fs::create_directories(work);
  bool need_compute = !f.skip_compute;
  std::string details;
  for (const auto& transport : f.transports) {
    const nlohmann::json r = run_transport(f, transport, need_compute, work);
    if (need_compute) {
      ComputeFigures figures;
      figures.ranks_per_node = f.ranks;
      figures.threads_per_rank = r.at("threads_per_rank").get<int>();
      for (auto it = r.at("compute").begin(); it != r.at("compute").end(); ++it)
        figures.by_precision[it.key()] = rates_from_json(it.value(), "compute." + it.key());
      // Replace figures measured at this rank count, keep the others.
      std::erase_if(profile.compute,
                    [&](const ComputeFigures& c) { return c.ranks_per_node == f.ranks; });
      profile.compute.push_back(figures);
      for (auto it = r.at("step_ms").begin(); it != r.at("step_ms").end(); ++it)
        details += fmt::format("{}: one micro-batch fwd+bwd+AdamW {:.0f} ms per rank; ", it.key(),
                               it.value().get<double>());
      need_compute = false;
    }
    const TransportFigures t = transport_from_json(r.at("transport"), transport);
    (transport == "shm" ? profile.intra_node : profile.inter_node) = t;
    if (f.transports.size() == 1 && f.base.empty()) profile.intra_node = profile.inter_node = t;
    details += transport + ": " + r.at("detail").get<std::string>() + "; ";
  }
  fs::remove_all(work);

  profile.name = f.name;
  profile.ranks_per_node = f.ranks;
  profile.memory_per_rank_bytes = available_memory_bytes() / f.ranks;
  profile.host_memory_per_node_bytes = available_memory_bytes();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::localtime(&now));
  profile.description = fmt::format(
      "calibrated {} on {}, {} ranks side by side, {} B={} T={}; intra-node: {}, inter-node: {}",
      date, cpu_model(), f.ranks, f.run.model, f.run.micro_batch, f.run.seq_len,
      profile.intra_node.name, profile.inter_node.name);
  if (!fs::path(out).parent_path().empty()) fs::create_directories(fs::path(out).parent_path());
  nlohmann::json j = profile.to_json();
  j["measurements"] = details;
  write_file_atomic(out, j.dump(1) + "\n");

  std::printf("\nprofile '%s' written to %s\n%s\n\n", profile.name.c_str(), out.c_str(),
              profile.description.c_str());
  std::printf("| precision | GEMM GFLOP/s | attention GFLOP/s | elementwise GB/s | loss GB/s | "
              "optimizer GB/s |\n|---|---|---|---|---|---|\n");
  for (const auto& c : profile.compute)
    for (const auto& [p, r] : c.by_precision)
      std::printf("| %s (%d ranks x %d threads) | %.1f | %.1f | %.2f | %.2f | %.2f |\n", p.c_str(),
                  c.ranks_per_node, c.threads_per_rank, r.gemm_flops_per_s / 1e9,
                  r.attention_flops_per_s / 1e9, r.elementwise_bytes_per_s / 1e9,
                  r.loss_bytes_per_s / 1e9, r.state_bytes_per_s / 1e9);
  std::printf("\n| transport | all_gather us/msg, GB/s | reduce_scatter | all_reduce | "
              "all_to_all | send_recv | compute share during comm |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const TransportFigures* t : {&profile.intra_node, &profile.inter_node})
    std::printf("| %s | %.1f, %.2f | %.1f, %.2f | %.1f, %.2f | %.1f, %.2f | %.1f, %.2f | %.2f |\n",
                t->name.c_str(), t->all_gather.latency_s * 1e6,
                t->all_gather.bus_bytes_per_s / 1e9, t->reduce_scatter.latency_s * 1e6,
                t->reduce_scatter.bus_bytes_per_s / 1e9, t->all_reduce.latency_s * 1e6,
                t->all_reduce.bus_bytes_per_s / 1e9, t->all_to_all.latency_s * 1e6,
                t->all_to_all.bus_bytes_per_s / 1e9, t->send_recv.latency_s * 1e6,
                t->send_recv.bus_bytes_per_s / 1e9, t->compute_share_during_comm);
  std::printf("\nmemory per rank (MemAvailable / %d): %s\n", f.ranks,
              gib(profile.memory_per_rank_bytes).c_str());
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto f = std::make_shared<CalibrateFlags>();
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Measure this machine (GEMM, attention, elementwise and optimizer rates on a model's "
      "kernels; latency and bandwidth of the collectives, all-to-all and send/recv over shared memory and TCP) and write a "
      "hardware profile for `plan`");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--model", f->run.model, "Model preset whose kernels are timed")->capture_default_str();
  cmd->add_option("--micro-batch", f->run.micro_batch, "Sequences per micro-batch")->capture_default_str();
  cmd->add_option("--seq-len", f->run.seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("-n,--ranks", f->ranks, "Ranks measuring side by side")->capture_default_str();
  cmd->add_option("--threads", f->run.threads,
                  "Threads per rank (default: the cores / ranks, as `train`)");
  cmd->add_option("--precisions", f->precisions, "Precisions to measure")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  cmd->add_option("--transports", f->transports,
                  "shm (Open MPI's shared memory) and/or tcp (Open MPI over TCP: the intra- and "
                  "inter-node transports of the profile)")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  cmd->add_option("--tcp-launcher", f->tcp_launcher,
                  "Command that starts the ranks for the tcp measurement instead of a local "
                  "`mpirun --mca btl tcp,self` (e.g. 'scripts/cluster-sim run --')");
  cmd->add_option("--base", f->base, "Start from this profile and replace what is measured");
  cmd->add_flag("--skip-compute", f->skip_compute,
                "Measure collectives only (compute figures from --base)");
  cmd->add_option("--out", f->out, "Profile file (default: " + default_profile_path() + ")");
  cmd->add_option("--name", f->name, "Profile name")->capture_default_str();
  cmd->add_option("--large-mib", f->large_mib, "Collective size for the bandwidth fit, MiB")
      ->capture_default_str();
  cmd->add_option("--repeats", f->repeats, "Timed repetitions (median / fastest)")->capture_default_str();
  cmd->add_option("--timeout", f->timeout, "Seconds each measuring job may take")->capture_default_str();
  cmd->add_option("--worker-transport", f->worker_transport)->group("");  // internal
  cmd->add_option("--worker-out", f->worker_out)->group("");
  cmd->callback([f]() {
    if (!f->worker_out.empty()) {
      run_worker(*f);
    } else {
      run_parent(*f);
    }
  });
}

}  // namespace shardlm::cli
