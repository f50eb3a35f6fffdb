// `shardlm bench`: trains each strategy (or flag variant) for a few steps on N ranks,
// reads the runs' metrics, and prints measured tokens/s, step time, exposed
// communication, traffic and memory next to `plan`'s prediction for the same flags,
// with ratios; writes bench.json and an HTML report. With --cluster it runs on a
// simulated cluster (scripts/cluster-sim: network namespaces joined at a set rate).
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <unistd.h>

#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/config_file.hpp"
#include "shardlm/cli/plan_flags.hpp"
#include "shardlm/comm/launch.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/subprocess.hpp"
#include "shardlm/plan/recommend.hpp"
#include "shardlm/report/bench_result.hpp"

namespace fs = std::filesystem;

namespace shardlm::cli {

namespace {

struct BenchFlags {
  TrainOptions run;
  int ranks = 2;
  std::vector<std::string> strategies = {"ddp", "zero1", "zero2", "zero3"};
  std::vector<std::string> variants;
  int64_t steps = 5;
  std::string cluster;  // "HOSTSxRATE", e.g. 2x1gbit
  std::string delay = "0.2ms";
  std::string cluster_sim;
  ProfileOptions profile;
  std::string out = "bench-out";
  double timeout = 1800;
};

struct Variant {
  std::string label;
  std::vector<std::string> flags;
};

// "zero3-no-reshard", "hybrid-2": the candidate names of `plan`, spelled for a flag.
Variant strategy_variant(const std::string& name) {
  if (name == "zero3-no-reshard")
    return {"zero3 no-reshard", {"--strategy", "zero3", "--reshard-after-forward", "false"}};
  static const std::regex hybrid("hybrid-([0-9]+)");
  std::smatch m;
  if (std::regex_match(name, m, hybrid))
    return {"hybrid " + m[1].str(), {"--strategy", "hybrid", "--shard-group-size", m[1].str()}};
  parse_strategy_kind(name);  // names the flag's valid values on a typo
  SHARDLM_CHECK(name != "hybrid", "--strategies: hybrid needs its group size, as hybrid-G (e.g. hybrid-2)");
  return {name, {"--strategy", name}};
}

Variant custom_variant(const std::string& spec) {
  const size_t eq = spec.find('=');
  SHARDLM_CHECK(eq != std::string::npos && eq > 0,
                "--variant '{}': expected LABEL=FLAGS, e.g. 'zero3 prefetch 2=--strategy zero3 "
                "--prefetch 2'",
                spec);
  return {spec.substr(0, eq), split_words(spec.substr(eq + 1))};
}

// The run's options: the bench's, then the variant's flags parsed as `train` would.
TrainOptions options_of(const TrainOptions& base, const Variant& v) {
  TrainOptions o = base;
  CLI::App app;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_run_shape_flags(app, o);
  std::vector<std::string> args(v.flags.rbegin(), v.flags.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("variant '{}': {} (flags: {})", v.label, e.what(), command_line(v.flags)));
  }
  return o;
}

std::vector<std::string> shape_args(const TrainOptions& o) {
  std::vector<std::string> a = {"--model", o.model, "--micro-batch", std::to_string(o.micro_batch),
                                "--seq-len", std::to_string(o.seq_len), "--precision", o.precision,
                                "--reduce-dtype", o.reduce_dtype, "--bucket-mb",
                                fmt::format("{}", o.bucket_mb), "--prefetch", std::to_string(o.prefetch),
                                "--min-unit-params", std::to_string(o.min_unit_params)};
  if (o.global_batch > 0) a.insert(a.end(), {"--global-batch", std::to_string(o.global_batch)});
  if (o.activation_checkpointing) a.push_back("--activation-checkpointing");
  for (auto [flag, value] : {std::pair{"--n-layer", o.n_layer}, {"--n-head", o.n_head},
                             {"--n-embd", o.n_embd}, {"--vocab-size", o.vocab_size}})
    if (value) a.insert(a.end(), {flag, std::to_string(*value)});
  return a;
}

std::string slug(const std::string& label) {
  std::string s;
  for (char c : label) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

std::string find_cluster_sim(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("SHARDLM_CLUSTER_SIM"); e != nullptr && *e) return e;
  const fs::path beside = fs::path(self_executable()).parent_path().parent_path() / "scripts" / "cluster-sim";
  if (fs::exists(beside)) return beside.string();
  SHARDLM_CHECK(fs::exists("scripts/cluster-sim"),
                "--cluster needs scripts/cluster-sim (not found beside the binary or in the current "
                "directory; pass --cluster-sim PATH)");
  return "scripts/cluster-sim";
}

// Brings up a simulated cluster of the bench's own (named after this process, so a cluster
// the user brought up with scripts/cluster-sim is neither used nor touched) and takes down
// only what it brought up. A failed `up` removes what it made itself (cluster-sim's trap).
class SimulatedCluster {
 public:
  SimulatedCluster(std::string script, int hosts, const std::string& rate, const std::string& delay,
                   const std::string& log)
      : script_(std::move(script)), name_(fmt::format("shardlm-bench-{}", ::getpid())), log_(log) {
    const CommandResult r = run_command({script_, "up", "--hosts", std::to_string(hosts), "--rate", rate,
                                         "--delay", delay, "--name", name_},
                                        120, log_);
    if (r.status != 0)
      throw Error(fmt::format("cluster-sim up --name {} failed with status {} (see {})", name_, r.status, log_));
  }
  ~SimulatedCluster() { run_command({script_, "down", "--name", name_}, 120, log_); }
  SimulatedCluster(const SimulatedCluster&) = delete;
  SimulatedCluster& operator=(const SimulatedCluster&) = delete;
  // The launcher prefix that runs a command as `ranks` ranks over this cluster's hosts.
  std::vector<std::string> run_prefix(int ranks) const {
    return {script_, "run", "-n", std::to_string(ranks), "--name", name_, "--"};
  }

 private:
  std::string script_, name_, log_;
};

void run_bench(const BenchFlags& f) {
  SHARDLM_CHECK(!f.run.data_dir.empty(), "--data is required (a directory from `shardlm prepare`)");
  SHARDLM_CHECK(f.ranks >= 1, "-n must be at least 1, got {}", f.ranks);
  SHARDLM_CHECK(f.steps >= 2, "--steps must be at least 2 (the first step is not measured), got {}",
                f.steps);
  std::vector<Variant> variants;
  for (const auto& s : f.strategies) variants.push_back(strategy_variant(s));
  for (const auto& v : f.variants) variants.push_back(custom_variant(v));
  SHARDLM_CHECK(!variants.empty(), "nothing to run: give --strategies and/or --variant");
  // The runs take their strategy (and so their mesh) from each variant.
  SHARDLM_CHECK(f.run.mesh.empty(),
                "bench: --mesh belongs in a --variant, beside the strategy it lays out (e.g. "
                "--variant 'hybrid 2=--strategy hybrid --mesh replicate=2,shard=2')");

  ProfileOptions profile_options = f.profile;
  int hosts = 0;
  std::string rate;
  if (!f.cluster.empty()) {
    static const std::regex spec("([0-9]+)x([0-9]+gbit|[0-9]+mbit)");
    std::smatch m;
    SHARDLM_CHECK(std::regex_match(f.cluster, m, spec),
                  "--cluster '{}': expected HOSTSxRATE, e.g. 2x1gbit or 2x25gbit", f.cluster);
    hosts = std::stoi(m[1].str());
    rate = m[2].str();
    SHARDLM_CHECK(hosts >= 2 && f.ranks % hosts == 0,
                  "--cluster {}: the {} ranks must split evenly over at least 2 hosts", f.cluster, f.ranks);
    profile_options.nodes = hosts;
    if (profile_options.link.empty()) {
      bool known = false;
      for (const auto& l : link_names()) known = known || l == rate;
      if (known) profile_options.link = rate;
    }
  }
  // Resolve and plan every variant before anything runs, so bad flags fail fast.
  struct Planned {
    Variant variant;
    TrainOptions options;
    RunPlan plan;
    std::optional<StepTimePrediction> time;
  };
  std::vector<Planned> planned;
  std::optional<HardwareProfile> profile;
  for (const Variant& v : variants) {
    const TrainOptions o = options_of(f.run, v);
    PlanInputs in = resolve_plan_inputs(o, f.ranks, profile_options);
    Planned p{v, o, plan_run(in.request), std::nullopt};
    if (in.profile) p.time = predict_step_time(p.plan, *in.profile, in.cluster);
    profile = in.profile;
    planned.push_back(std::move(p));
  }

  fs::create_directories(fs::path(f.out) / "runs");
  const std::string log = (fs::path(f.out) / "bench.log").string();
  std::unique_ptr<SimulatedCluster> cluster;
  if (hosts > 0) {
    std::printf("bench: bringing up a simulated cluster of %d hosts at %s, %s delay\n", hosts,
                rate.c_str(), f.delay.c_str());
    cluster = std::make_unique<SimulatedCluster>(find_cluster_sim(f.cluster_sim), hosts, rate, f.delay, log);
  }
  report::BenchResult result;
  result.setup = {{"model", f.run.model},
                  {"ranks", f.ranks},
                  {"precision", f.run.precision},
                  {"micro_batch", f.run.micro_batch},
                  {"seq_len", f.run.seq_len},
                  {"steps", f.steps},
                  {"threads_per_rank", f.run.threads ? std::to_string(*f.run.threads)
                                                     : "train's default (cores / ranks)"},
                  {"cluster", f.cluster.empty() ? "this machine (shared memory)"
                                                : f.cluster + ", " + f.delay + " delay"},
                  {"profile", profile ? profile->name + ": " + profile->description : "none"},
                  {"load_average_at_start", load_average()}};
  for (const Planned& p : planned) {
    const std::string dir = "runs/" + slug(p.variant.label);
    const fs::path run_dir = fs::path(f.out) / dir;
    fs::remove_all(run_dir);
    std::vector<std::string> train = {self_executable(), "train", "--data", f.run.data_dir, "--out",
                                      run_dir.string(), "--steps", std::to_string(f.steps),
                                      "--eval-batches", "0", "--log-every", "1"};
    if (f.run.threads) train.insert(train.end(), {"--threads", std::to_string(*f.run.threads)});
    const auto shape = shape_args(f.run);
    train.insert(train.end(), shape.begin(), shape.end());
    train.insert(train.end(), p.variant.flags.begin(), p.variant.flags.end());
    std::vector<std::string> argv;
    if (cluster) {
      argv = cluster->run_prefix(f.ranks);
      argv.insert(argv.end(), train.begin(), train.end());
    } else {
      argv = f.ranks > 1 ? mpirun_command(f.ranks, train) : train;
    }
    std::printf("bench: %s ...\n", p.variant.label.c_str());
    std::fflush(stdout);
    {
      std::ofstream(log, std::ios::app) << "\n$ " << command_line(argv) << "\n";
    }
    const CommandResult r = run_command(argv, f.timeout, log);
    SHARDLM_CHECK(r.status == 0, "bench: {} {} (see {}; command: {})", p.variant.label,
                  r.timed_out ? fmt::format("timed out after {} s", f.timeout)
                              : fmt::format("failed with status {}", r.status),
                  log, command_line(argv));
    report::BenchRow row;
    row.label = p.variant.label;
    row.flags = command_line(p.variant.flags);
    row.run_dir = dir;
    row.measured = report::steady_state(report::load_run(run_dir.string()));
    if (p.time) {
      const auto& t = *p.time;
      row.predicted = {true,          t.step_s * 1e3,    t.tokens_per_s, t.compute_s * 1e3,
                       t.comm_s * 1e3, t.exposed_s * 1e3, t.overlap_cost_s * 1e3};
    }
    row.planned_wire_bytes = p.plan.wire_bytes_per_step;
    row.planned_bytes = {{"params", p.plan.params},       {"frozen", p.plan.frozen}, {"grads", p.plan.grads},
                         {"optimizer", p.plan.optimizer}, {"activations", p.plan.activations},
                         {"comm", p.plan.comm}};
    result.rows.push_back(std::move(row));
  }
  cluster.reset();
  result.setup["load_average_at_end"] = load_average();
  write_file_atomic((fs::path(f.out) / "bench.json").string(), result.to_json().dump(1) + "\n");
  const std::string html = write_report(f.out, "");
  std::printf("\n%s: %d rank(s), %s, micro-batch %d x %d, %lld steps (medians after the first); %s\n",
              f.run.model.c_str(), f.ranks, f.run.precision.c_str(), f.run.micro_batch, f.run.seq_len,
              static_cast<long long>(f.steps), result.setup["cluster"].get<std::string>().c_str());
  std::printf("predicted with: %s\n\n%s\n", result.setup["profile"].get<std::string>().c_str(),
              report::bench_table(result).c_str());
  std::printf("ratio = measured / predicted; load average %s at start, %s at end\n",
              result.setup["load_average_at_start"].get<std::string>().c_str(),
              result.setup["load_average_at_end"].get<std::string>().c_str());
  std::printf("bench.json and the report: %s, %s\n", (fs::path(f.out) / "bench.json").c_str(), html.c_str());
}

}  // namespace

void register_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  auto* cmd = app.add_subcommand(
      "bench", "Train each strategy a few steps and print measured vs predicted time, traffic and "
               "memory (writes bench.json and an HTML report)");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--data", f->run.data_dir, "Directory written by `shardlm prepare` (required)");
  cmd->add_option("-n,--ranks", f->ranks, "Ranks of every run")->capture_default_str();
  cmd->add_option("--strategies", f->strategies,
                  "Strategies to run: ddp, zero1, zero2, zero3, zero3-no-reshard, hybrid-G")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  cmd->add_option("--variant", f->variants,
                  "Another run, as 'LABEL=train flags' (e.g. 'zero3 prefetch 2=--strategy zero3 "
                  "--prefetch 2'); repeatable")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--steps", f->steps, "Steps per run (the first is not measured)")->capture_default_str();
  cmd->add_option("--threads", f->run.threads, "Threads per rank (default: as `train`)");
  cmd->add_option("--cluster", f->cluster,
                  "Run on a simulated cluster: HOSTSxRATE (e.g. 2x1gbit), via scripts/cluster-sim");
  cmd->add_option("--delay", f->delay, "--cluster: one-way delay of each link")->capture_default_str();
  cmd->add_option("--cluster-sim", f->cluster_sim, "Path of scripts/cluster-sim");
  cmd->add_option("--out", f->out, "Bench directory (runs/, bench.json, report.html)")->capture_default_str();
  cmd->add_option("--timeout", f->timeout, "Seconds each run may take")->capture_default_str();
  add_profile_flags(*cmd, f->profile);
  add_run_shape_flags(*cmd, f->run);
  // Each run's strategy comes from --strategies or its --variant: the shape's strategy
  // flags would be silently overridden, so bench refuses them.
  const std::vector<std::string> strategy_flags = {"--strategy", "--shard-group-size", "--reshard-after-forward"};
  for (const std::string& flag : strategy_flags)
    cmd->get_option(flag)
        ->description("Not for bench: --strategies (or a --variant 'LABEL=--strategy ...') names each run's")
        ->default_str("");
  add_config_flag(*cmd);
  cmd->callback([f, cmd, strategy_flags]() {
    for (const std::string& flag : strategy_flags)
      SHARDLM_CHECK(cmd->count(flag) == 0,
                    "bench: {} is not for bench (each run's strategy comes from --strategies, e.g. "
                    "--strategies ddp,zero3, or --variant 'LABEL={} ...')",
                    flag, flag);
    run_bench(*f);
  });
}

}  // namespace shardlm::cli
