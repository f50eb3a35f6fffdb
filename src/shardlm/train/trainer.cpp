#include "shardlm/train/trainer.hpp"

#include <omp.h>
#include <sched.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_export.hpp"
#include "shardlm/comm/world.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/fault_injection.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/model/gpt2_model.hpp"
#include "shardlm/optim/adamw.hpp"
#include "shardlm/optim/loss_scaler.hpp"
#include "shardlm/optim/lr_schedule.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/loaded_model.hpp"
#include "shardlm/train/metrics.hpp"
#include "shardlm/train/model_runner.hpp"
#include "shardlm/train/progress.hpp"
#include "shardlm/train/sampling.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

// Ranks of this job on this machine (Open MPI tells; otherwise assume all).
int local_ranks(int world_size) {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(s));
  return world_size;
}


void validate_options(const TrainOptions& o, const ModelConfig& config) {
  SHARDLM_CHECK(o.steps >= 0, "--steps must be >= 0, got {}", o.steps);
  SHARDLM_CHECK(o.micro_batch > 0, "--micro-batch must be positive, got {}", o.micro_batch);
  SHARDLM_CHECK(o.seq_len > 0, "--seq-len must be positive, got {}", o.seq_len);
  SHARDLM_CHECK(o.seq_len <= config.max_seq_len,
                "--seq-len {} is longer than the model's context ({} positions)", o.seq_len,
                config.max_seq_len);
  SHARDLM_CHECK(o.global_batch >= 0, "--global-batch must be positive, got {}", o.global_batch);
  SHARDLM_CHECK(o.lr > 0.0f, "--lr must be positive, got {}", o.lr);
  SHARDLM_CHECK(o.warmup >= 0, "--warmup must be >= 0, got {}", o.warmup);
  SHARDLM_CHECK(o.eval_batches >= 0, "--eval-batches must be >= 0, got {}", o.eval_batches);
  SHARDLM_CHECK(o.threads >= 0, "--threads must be >= 0, got {}", o.threads);
  SHARDLM_CHECK(o.comm_timeout > 0, "--comm-timeout must be positive, got {}", o.comm_timeout);
  SHARDLM_CHECK(!o.out_dir.empty(), "--out is required (the run directory)");
  parse_dtype(o.precision, "--precision");
  SHARDLM_CHECK(o.reduce_dtype == "fp32" || o.reduce_dtype == "bf16",
                "--reduce-dtype must be fp32 or bf16, got '{}'", o.reduce_dtype);
  SHARDLM_CHECK(o.loss_scale > 0, "--loss-scale must be positive, got {}", o.loss_scale);
  SHARDLM_CHECK(o.loss_scale_growth_interval > 0,
                "--loss-scale-growth-interval must be positive, got {}",
                o.loss_scale_growth_interval);
}

// Compares the options that fix a run's trajectory against a checkpoint's.
void check_resume_compatible(const CheckpointReader& ckpt, const ModelConfig& config,
                             const nlohmann::json& wanted, const std::string& tokenizer) {
  const auto& saved = ckpt.info();
  auto saved_model = saved.model.to_json();
  auto wanted_model = config.to_json();
  for (auto it = wanted_model.begin(); it != wanted_model.end(); ++it)
    SHARDLM_CHECK(saved_model.value(it.key(), nlohmann::json()) == it.value(),
                  "checkpoint '{}' was trained with model {}={}, but this run asks for {} "
                  "(use another --out, or the same model flags)",
                  ckpt.dir(), it.key(), saved_model.value(it.key(), nlohmann::json()).dump(),
                  it.value().dump());
  SHARDLM_CHECK(saved.tokenizer == tokenizer,
                "checkpoint '{}' was trained with tokenizer '{}', the data uses '{}'", ckpt.dir(),
                saved.tokenizer, tokenizer);
  const auto& saved_train = saved.train.at("options");
  // A key the checkpoint lacks was written before that option existed: it ran with
  // the option's default.
  const nlohmann::json defaults = TrainOptions{}.trajectory_json();
  for (auto it = wanted.begin(); it != wanted.end(); ++it) {
    const nlohmann::json saved_value =
        saved_train.contains(it.key()) ? saved_train.at(it.key()) : defaults.value(it.key(), nlohmann::json());
    SHARDLM_CHECK(saved_value == it.value(),
                  "checkpoint '{}' was trained with {}={}, but this run asks for {} (resume "
                  "needs the same value)",
                  ckpt.dir(), it.key(), saved_value.dump(), it.value().dump());
  }
}

// Start-up agreement: rank 0's view of the run against this rank's; the first field
// that differs is named.
void check_ranks_agree(Communicator& comm, const nlohmann::json& mine) {
  std::string text = mine.dump();
  comm.broadcast_string(text, 0, "start-up agreement");
  const nlohmann::json root = nlohmann::json::parse(text);
  const auto flat_root = root.flatten();
  const auto flat_mine = mine.flatten();
  for (auto it = flat_root.begin(); it != flat_root.end(); ++it) {
    auto other = flat_mine.value(it.key(), nlohmann::json());
    SHARDLM_CHECK(other == it.value(),
                  "rank {} disagrees with rank 0 on {}: {} here, {} on rank 0 (all ranks must "
                  "run the same command on the same data)",
                  comm.rank(), it.key(), other.dump(), it.value().dump());
  }
}

// sha256 of the replicated parameters, for --check-replicas.
uint64_t replicated_params_digest(const ParamLayout& layout, const FlatUnitStrategy& strategy) {
  Sha256 hasher;
  for (int u = 0; u < layout.num_units(); ++u)
    if (const float* params = strategy.replicated_params(u))
      hasher.update(params, static_cast<size_t>(layout.units[static_cast<size_t>(u)].padded_numel) *
                                sizeof(float));
  return std::stoull(hasher.hex_digest().substr(0, 16), nullptr, 16);
}

class Trainer {
 public:
  Trainer(const TrainOptions& o, Communicator& comm) : o_(o), comm_(comm) {}
  TrainSummary run();

 private:
  double evaluate();
  void save(int64_t step, const std::string& run_dir);
  void print(const std::string& text) const {
    if (is_root_) std::fputs(text.c_str(), stdout), std::fflush(stdout);
  }

  const TrainOptions& o_;
  Communicator& comm_;
  const bool is_root_ = comm_.rank() == 0;
  const int world_ = comm_.size();
  const int rank_ = comm_.rank();

  DatasetMeta meta_;
  ModelConfig config_;
  StrategyOptions strategy_options_;
  nlohmann::json trajectory_;
  std::unique_ptr<TokenFile> train_tokens_, val_tokens_;
  std::unique_ptr<EvalSampler> val_sampler_;
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<Gpt2Model> model_;
  std::unique_ptr<FlatUnitStrategy> strategy_;
  std::unique_ptr<ModelRunner> runner_;
  std::optional<LossScaler> loss_scaler_;  // fp16 only
  int64_t tokens_seen_ = 0;
  nlohmann::json last_save_;  // timing of the last checkpoint save, for the metrics
  Stopwatch wall_;  // since the trainer started (restart-to-first-step, save and load times)
};

TrainSummary Trainer::run() {
  Stopwatch& wall = wall_;
  const int threads =
      o_.threads > 0 ? o_.threads : std::max(1, available_cores() / local_ranks(world_));
  omp_set_num_threads(threads);

  // Inputs first: nothing in the run directory is touched until they check out.
  meta_ = read_dataset_meta(o_.data_dir);
  config_ = resolve_model_config(o_, static_cast<int>(meta_.vocab_size));
  validate_options(o_, config_);
  strategy_options_ = {parse_strategy_kind(o_.strategy), o_.bucket_mb, o_.prefetch,
                       o_.reshard_after_forward, o_.shard_group_size,
                       parse_dtype(o_.precision, "--precision"),
                       parse_dtype(o_.reduce_dtype, "--reduce-dtype")};
  const int partition = partition_size(strategy_options_, world_);
  const int global_batch = o_.global_batch > 0 ? o_.global_batch : o_.micro_batch * world_;
  SHARDLM_CHECK(global_batch >= world_,
                "world size {} is larger than the global batch of {} sequences (every rank "
                "needs at least one sequence per step)",
                world_, global_batch);
  const BatchPartition batches(global_batch, world_, o_.micro_batch);
  const int accumulation = batches.accumulation_steps();
  TrainOptions resolved = o_;
  resolved.global_batch = global_batch;
  trajectory_ = resolved.trajectory_json();

  train_tokens_ = std::make_unique<TokenFile>(dataset_train_path(o_.data_dir));
  val_tokens_ = std::make_unique<TokenFile>(dataset_val_path(o_.data_dir));
  BatchSampler train_sampler(*train_tokens_, o_.seq_len, o_.seed);
  if (val_tokens_->size() > o_.seq_len)
    val_sampler_ = std::make_unique<EvalSampler>(*val_tokens_, o_.seq_len);
  auto tokenizer = make_tokenizer(meta_.tokenizer);

  nlohmann::json agreement = {{"model", config_.to_json()},
                              {"options", trajectory_},
                              {"steps", o_.steps},
                              {"micro_batch", o_.micro_batch},
                              {"strategy", o_.strategy},
                              {"prefetch", o_.prefetch},
                              {"shard_group_size", o_.shard_group_size},
                              {"min_unit_params", o_.min_unit_params},
                              {"tokenizer", meta_.tokenizer},
                              {"train_tokens", train_tokens_->size()},
                              {"val_tokens", val_tokens_->size()},
                              {"world_size", world_}};
  for (const auto& src : meta_.sources) agreement["data_sha256"].push_back(src.sha256);
  check_ranks_agree(comm_, agreement);

  std::unique_ptr<CheckpointReader> resume_from;
  if (!o_.resume) {
    const auto existing = list_checkpoints(o_.out_dir);
    SHARDLM_CHECK(existing.empty(),
                  "run directory '{}' already holds a run (checkpoint '{}'); pass --resume to "
                  "continue it or choose another --out",
                  o_.out_dir, existing.empty() ? "" : existing.front());
  } else {
    resume_from = open_newest_valid_checkpoint(
        o_.out_dir, [&](const std::string& warning) { print("warning: " + warning + "\n"); });
    if (resume_from) check_resume_compatible(*resume_from, config_, trajectory_, meta_.tokenizer);
  }
  if (is_root_) {
    std::error_code ec;
    fs::create_directories(o_.out_dir, ec);
    SHARDLM_CHECK(!ec, "cannot create run directory '{}': {}", o_.out_dir, ec.message());
  }

  layout_ = std::make_unique<ParamLayout>(ParamLayout::build(config_, partition, o_.min_unit_params));
  const ModelOptions model_options{parse_dtype(o_.precision, "--precision"),
                                   o_.activation_checkpointing};
  model_ = std::make_unique<Gpt2Model>(config_, *layout_, o_.micro_batch, o_.seq_len,
                                       model_options);
  if (model_options.precision == DType::fp16) {
    LossScalerConfig scaler_config;
    scaler_config.initial_scale = o_.loss_scale;
    scaler_config.growth_interval = o_.loss_scale_growth_interval;
    loss_scaler_.emplace(scaler_config);
  }
  strategy_ = std::make_unique<FlatUnitStrategy>(*layout_, model_unit_needs(*model_), comm_,
                                                 strategy_options_);
  runner_ = std::make_unique<ModelRunner>(*model_, *strategy_);

  int64_t start_step = 0;
  if (resume_from) {
    Stopwatch load_clock;
    resume_from->load_into(*layout_, *strategy_);
    const double load_s = load_clock.seconds();
    start_step = resume_from->info().step;
    tokens_seen_ = resume_from->info().tokens_seen;
    if (loss_scaler_ && resume_from->info().train.contains("loss_scaler"))
      loss_scaler_->load_json(resume_from->info().train.at("loss_scaler"));
    auto saved_steps = resume_from->info().train.at("options").value("steps", int64_t{0});
    if (saved_steps != o_.steps)
      print(fmt::format("note: --steps changed from {} to {}; the cosine schedule stretches\n",
                        saved_steps, o_.steps));
    print(fmt::format("resumed from {} (step {}, written by {} x {}; loaded in {:.2f} s)\n",
                      resume_from->dir(), start_step, resume_from->info().strategy,
                      resume_from->info().world_size, load_s));
    // Test-only: write the state just loaded (under this run's layout) elsewhere, so a
    // test can check that resharding on load changed no bit.
    if (const char* dir = std::getenv("SHARDLM_TEST_SAVE_AFTER_LOAD")) save(start_step, dir);
  } else if (!o_.init_from.empty()) {
    import_hugging_face(o_.init_from, config_, *layout_, *strategy_);
    print(fmt::format("initialised from {}\n", o_.init_from));
  } else {
    // Init is a function of (seed, tensor name): each rank fills its owned slices.
    for (int u = 0; u < layout_->num_units(); ++u) {
      OwnedSlice s = strategy_->owned(u);
      model_->init_range(u, o_.seed, s.begin, s.end, s.master);
    }
    strategy_->after_load();
  }
  const bool resume_from_checkpoint = resume_from != nullptr;
  resume_from.reset();
  SHARDLM_CHECK(start_step <= o_.steps,
                "checkpoint is at step {}, beyond --steps {} (raise --steps to train further)",
                start_step, o_.steps);

  std::unique_ptr<MetricsWriter> metrics;
  if (is_root_) {
    nlohmann::json run_config = {{"model", config_.to_json()},
                                 {"tokenizer", meta_.tokenizer},
                                 {"data", fs::absolute(o_.data_dir).string()},
                                 {"options", trajectory_},
                                 {"steps", o_.steps},
                                 {"micro_batch", o_.micro_batch},
                                 {"threads", threads},
                                 {"activation_checkpointing", o_.activation_checkpointing},
                                 {"strategy", strategy_->name()},
                                 {"world_size", world_}};
    write_file_atomic((fs::path(o_.out_dir) / "config.json").string(), run_config.dump(2) + "\n");
    metrics = std::make_unique<MetricsWriter>((fs::path(o_.out_dir) / "metrics.jsonl").string());
  }

  const LrSchedule schedule{o_.lr, o_.min_lr.value_or(o_.lr / 10.0f), o_.warmup, o_.steps};
  const AdamWConfig adam{o_.beta1, o_.beta2, 1e-8f, o_.weight_decay};
  std::vector<std::vector<ElementRange>> decay_ranges;
  for (int u = 0; u < layout_->num_units(); ++u) {
    OwnedSlice s = strategy_->owned(u);
    decay_ranges.push_back(weight_decay_ranges(layout_->units[static_cast<size_t>(u)], s.begin, s.end));
  }

  // This rank's tokens for every micro-batch of a step, allocated once.
  const size_t micro_tokens = static_cast<size_t>(o_.micro_batch) * static_cast<size_t>(o_.seq_len);
  std::vector<int32_t> tokens(micro_tokens * static_cast<size_t>(accumulation));
  std::vector<int32_t> targets(tokens.size());

  print(fmt::format(
      "model {}: {} layers, {} heads, {} wide, vocab {} (padded {}), {:.2f}M parameters\n",
      o_.model, config_.n_layer, config_.n_head, config_.n_embd, config_.vocab_size,
      config_.padded_vocab_size(), static_cast<double>(config_.num_parameters()) / 1e6));
  print(fmt::format("data {}: {} train / {} val tokens ({})\n", o_.data_dir,
                    train_tokens_->size(), val_tokens_->size(), meta_.tokenizer));
  print(fmt::format("batch {} x {} tokens (micro-batch {}, {} accumulation steps); strategy {} "
                    "on {} rank(s) x {} threads; GEMM {}\n",
                    global_batch, o_.seq_len, o_.micro_batch, accumulation, strategy_->name(),
                    world_, threads, cpu::gemm_library_name()));
  // More busy threads than cores makes OpenMP barriers wait for descheduled threads
  // (GEMMs and kernels are split evenly across threads, so the slowest one sets the pace).
  if (const int cores = available_cores(), ranks_here = local_ranks(world_);
      ranks_here * threads > cores)
    print(fmt::format("warning: {} rank(s) on this host x {} threads = {} threads on {} cores; "
                      "expect slower steps (use --threads {} or fewer ranks)\n",
                      ranks_here, threads, ranks_here * threads, cores,
                      std::max(1, cores / ranks_here)));
  if (model_options.precision != DType::fp32 || o_.activation_checkpointing)
    print(fmt::format("precision {} (fp32 master weights and gradients){}\n", o_.precision,
                      o_.activation_checkpointing ? "; activation checkpointing" : ""));

  TrainSummary summary;
  summary.first_step = start_step;
  summary.num_parameters = config_.num_parameters();
  const int64_t log_every = o_.log_every > 0 ? o_.log_every : std::max<int64_t>(1, o_.steps / 20);
  std::unique_ptr<ProgressLine> progress;
  if (is_root_) progress = std::make_unique<ProgressLine>(o_.steps, log_every);
  Stopwatch train_clock;
  double ema_step_s = 0.0;
  const int64_t tokens_per_step = static_cast<int64_t>(global_batch) * o_.seq_len;
  double last_loss = std::nan("");
  comm_.take_counters();
  strategy_->take_group_counters();

  for (int64_t step = start_step; step < o_.steps; ++step) {
    Stopwatch step_clock;
    take_phase_totals();  // drop what ran between steps (eval, checkpoint save)
    if (const char* fault = std::getenv("SHARDLM_FAULT_STEP")) {
      // Test-only: "RANK:STEP[:always]" kills that rank when it reaches that step, in
      // the first attempt of a `shardlm launch` job only (so a restart can get past
      // it) unless ":always".
      int fault_rank = -1;
      long long fault_step = -1;
      char mode[16] = "";
      const char* restart = std::getenv("SHARDLM_RESTART_COUNT");
      const bool first_attempt = restart == nullptr || std::string_view(restart) == "0";
      if (std::sscanf(fault, "%d:%lld:%15s", &fault_rank, &fault_step, mode) >= 2 &&
          fault_rank == rank_ && fault_step == step + 1 &&
          (first_attempt || std::string_view(mode) == "always")) {
        std::fprintf(stderr, "rank %d: fault injected at step %lld: exiting\n", rank_, fault_step);
        std::_Exit(43);
      }
    }
    int64_t counts[1] = {0};
    for (int k = 0; k < accumulation; ++k) {
      train_sampler.fill_batch(batches.first_sample(step, rank_, k), o_.micro_batch,
                               tokens.data() + micro_tokens * static_cast<size_t>(k),
                               targets.data() + micro_tokens * static_cast<size_t>(k));
    }
    for (int32_t t : targets) counts[0] += (t != kIgnoreIndex);
    // The loss is the mean over the global batch's target tokens, not a mean of means.
    comm_.all_reduce_blocking(std::span<int64_t>(counts, 1), ReduceOp::sum, "target count");
    SHARDLM_CHECK(counts[0] > 0, "step {} has no target tokens (all ignored)", step + 1);
    // fp16: the loss (so every gradient) is multiplied by the loss scale, and the
    // optimizer divides it out again through the gradient multiplier.
    const double loss_scale = loss_scaler_ ? loss_scaler_->scale() : 1.0;
    const float grad_scale = static_cast<float>(loss_scale / static_cast<double>(counts[0]));

    strategy_->begin_step(accumulation);
    double loss_sum = 0.0;
    for (int k = 0; k < accumulation; ++k) {
      MicroBatch batch{tokens.data() + micro_tokens * static_cast<size_t>(k),
                       targets.data() + micro_tokens * static_cast<size_t>(k), o_.micro_batch,
                       o_.seq_len};
      loss_sum += runner_->forward(batch, /*training=*/true, grad_scale);
      runner_->backward(batch, k);
    }
    strategy_->finish_gradients();
    comm_.all_reduce_blocking(std::span<double>(&loss_sum, 1), ReduceOp::sum, "loss sum");
    const double loss = loss_sum / static_cast<double>(counts[0]);
    // All-reduced, so every rank sees the same (possibly non-finite) value.
    const double grad_norm = std::sqrt(strategy_->global_grad_norm_squared()) / loss_scale;
    bool apply_step = true;
    if (loss_scaler_) {
      // An overflow anywhere (a scaled gradient beyond fp16's range) skips the step
      // on every rank and backs the scale off.
      const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
      SHARDLM_CHECK(finite || loss_scale > 1.0,
                    "training diverged at step {}: loss {} and gradient norm {} are not finite "
                    "even at loss scale {} (the last checkpoint is kept; try a lower --lr or "
                    "bf16)",
                    step + 1, loss, grad_norm, loss_scale);
      apply_step = loss_scaler_->update(finite);
    }
    SHARDLM_CHECK(!apply_step || (std::isfinite(loss) && std::isfinite(grad_norm)),
                  "training diverged at step {}: loss {} and gradient norm {} (the last "
                  "checkpoint is kept; try a lower --lr or a higher --warmup)",
                  step + 1, loss, grad_norm);
    const float lr = schedule.at(step);
    if (apply_step) {
      const float multiplier =
          static_cast<float>(clip_multiplier(grad_norm, o_.grad_clip) / loss_scale);
      // AdamW's step count (bias correction) counts the steps it took.
      const int64_t adam_step =
          step + 1 - (loss_scaler_ ? loss_scaler_->skipped_steps() : int64_t{0});
      for (int u = 0; u < layout_->num_units(); ++u) {
        OwnedSlice s = strategy_->owned(u);
        adamw_update(s.master, s.grad, s.adam_m, s.adam_v, s.size(),
                     decay_ranges[static_cast<size_t>(u)], lr, multiplier, adam_step, adam,
                     s.compute_copy);
      }
    }
    strategy_->after_step();
    if (o_.check_replicas) {
      strategy_->synchronize();
      auto digests = comm_.all_gather_u64(replicated_params_digest(*layout_, *strategy_),
                                          "replica digest");
      for (int r = 1; r < world_; ++r)
        SHARDLM_CHECK(digests[static_cast<size_t>(r)] == digests[0],
                      "replicas diverged after step {}: rank {}'s parameters differ from rank 0's",
                      step + 1, r);
    }
    tokens_seen_ += tokens_per_step;
    summary.tokens += tokens_per_step;
    if (step == start_step) summary.first_loss = loss;
    last_loss = loss;

    const int64_t done = step + 1;
    const double step_s = step_clock.seconds();
    ema_step_s = (step == start_step) ? step_s : 0.8 * ema_step_s + 0.2 * step_s;
    CommCounters comm_stats = comm_.take_counters();
    comm_stats += strategy_->take_group_counters();
    const PhaseTotals phases = take_phase_totals();
    nlohmann::json record = {{"step", done},
                             {"loss", loss},
                             {"lr", lr},
                             {"grad_norm", std::isfinite(grad_norm) ? nlohmann::json(grad_norm)
                                                                    : nlohmann::json()},
                             {"tokens_per_s", static_cast<double>(tokens_per_step) / step_s},
                             {"step_ms", step_s * 1e3},
                             {"tokens_seen", tokens_seen_},
                             {"since_start_s", wall_.seconds()},
                             {"world_size", world_},
                             {"strategy", strategy_->name()},
                             {"comm_bytes", comm_stats.total().bus_bytes},
                             {"comm_ms", comm_stats.total().seconds * 1e3},
                             {"exposed_comm_ms", comm_stats.exposed_seconds * 1e3},
                             {"comm", comm_stats.to_json()},
                             {"mem", MemoryTracker::global().to_json()}};
    record["phase_ms"] = phase_ms_json(phases, step_s, comm_stats.exposed_seconds);
    if (loss_scaler_) {
      record["loss_scale"] = loss_scale;  // the scale this step ran with
      record["skipped_steps"] = loss_scaler_->skipped_steps();
      if (!apply_step) record["skipped"] = true;
    }
    if ((o_.eval_every > 0 && done % o_.eval_every == 0) || done == o_.steps) {
      double val_loss = evaluate();
      if (std::isfinite(val_loss)) {
        record["val_loss"] = val_loss;
        summary.final_val_loss = val_loss;
        if (progress) progress->message(fmt::format("step {}: val loss {:.4f}", done, val_loss));
      }
    }
    if ((o_.save_every > 0 && done % o_.save_every == 0) || done == o_.steps) {
      save(done, o_.out_dir);
      summary.last_checkpoint = (fs::path(o_.out_dir) / "checkpoints" / fmt::format("step_{:08d}", done)).string();
      if (last_save_.is_object()) record.update(last_save_);
    }
    if (metrics) metrics->write(record);
    if (progress)
      progress->update(done, loss, lr, static_cast<double>(tokens_per_step) / step_s,
                       ema_step_s * static_cast<double>(o_.steps - done));
  }
  if (progress) progress->finish();
  if (start_step == o_.steps && !resume_from_checkpoint) {
    save(start_step, o_.out_dir);  // --steps 0: the initial (or imported) state
    summary.last_checkpoint = (fs::path(o_.out_dir) / "checkpoints" / "step_00000000").string();
  }
  const double train_s = train_clock.seconds();
  summary.steps = o_.steps;
  summary.final_train_loss = last_loss;
  summary.tokens_per_s = train_s > 0 ? static_cast<double>(summary.tokens) / train_s : 0.0;

  if (o_.sample_tokens > 0) {
    std::vector<int32_t> prompt = tokenizer->encode(o_.sample_prompt);
    if (prompt.empty()) prompt.push_back(tokenizer->end_of_text().value_or(0));
    SamplingOptions sampling{o_.sample_tokens, o_.sample_temperature, o_.sample_top_k, o_.seed};
    auto ids = generate(*runner_, prompt, o_.seq_len, sampling);
    summary.sample = o_.sample_prompt + tokenizer->decode(ids);
  }
  strategy_->synchronize();
  summary.memory = MemoryTracker::global().to_json();
  summary.wall_s = wall.seconds();
  return summary;
}

double Trainer::evaluate() {
  if (!val_sampler_ || o_.eval_batches == 0) return std::nan("");
  // The first eval_batches x micro_batch windows of val.bin whatever the world size;
  // each pass gives every rank micro_batch rows, rows past the end are fully ignored.
  const int64_t windows =
      std::min<int64_t>(static_cast<int64_t>(o_.eval_batches) * o_.micro_batch,
                        val_sampler_->num_windows());
  const int64_t rows_per_pass = static_cast<int64_t>(o_.micro_batch) * world_;
  const size_t micro_tokens = static_cast<size_t>(o_.micro_batch) * static_cast<size_t>(o_.seq_len);
  std::vector<int32_t> tokens(micro_tokens), targets(micro_tokens);
  double sums[1] = {0.0};
  int64_t counts[1] = {0};
  for (int64_t first = 0; first < windows; first += rows_per_pass) {
    for (int i = 0; i < o_.micro_batch; ++i) {
      const int64_t w = first + static_cast<int64_t>(rank_) * o_.micro_batch + i;
      int32_t* tok = tokens.data() + static_cast<size_t>(i) * o_.seq_len;
      int32_t* tgt = targets.data() + static_cast<size_t>(i) * o_.seq_len;
      if (w < windows) {
        val_sampler_->fill(w, tok, tgt);
      } else {
        std::fill(tok, tok + o_.seq_len, 0);
        std::fill(tgt, tgt + o_.seq_len, kIgnoreIndex);
      }
    }
    MicroBatch batch{tokens.data(), targets.data(), o_.micro_batch, o_.seq_len};
    sums[0] += runner_->forward(batch, /*training=*/false, 0.0f);
    counts[0] += model_->last_target_count();
  }
  comm_.all_reduce_blocking(std::span<double>(sums, 1), ReduceOp::sum, "eval loss sum");
  comm_.all_reduce_blocking(std::span<int64_t>(counts, 1), ReduceOp::sum, "eval target count");
  return counts[0] > 0 ? sums[0] / static_cast<double>(counts[0]) : std::nan("");
}

void Trainer::save(int64_t step, const std::string& run_dir) {
  nlohmann::json options = trajectory_;
  options["steps"] = o_.steps;
  CheckpointInfo info{step, tokens_seen_, config_, meta_.tokenizer, strategy_->name(), world_,
                      {{"options", options}}};
  if (loss_scaler_) info.train["loss_scaler"] = loss_scaler_->to_json();
  Stopwatch clock;
  const std::string dir = save_checkpoint(run_dir, *layout_, *strategy_, info, o_.keep, comm_);
  if (is_root_) {
    uintmax_t bytes = 0;
    for (const auto& entry : fs::directory_iterator(dir)) bytes += entry.file_size();
    last_save_ = {{"save_ms", clock.millis()}, {"checkpoint_bytes", bytes}};
  }
}

}  // namespace

TrainSummary run_training(const TrainOptions& options) {
  CommOptions comm_options;
  comm_options.timeout_seconds = options.comm_timeout;
  auto comm = make_world_communicator(comm_options);
  TrainSummary summary;
  try {
    summary = Trainer(options, *comm).run();
  } catch (const std::exception& e) {
    // One rank's error brings the whole job down (no peer left waiting).
    if (comm->size() > 1) comm->abort_job(std::string("error: ") + e.what());
    throw;
  }
  summary.is_root = comm->rank() == 0;
  comm->finalize();
  return summary;
}

void print_summary(const TrainSummary& s) {
  if (!s.is_root) return;
  auto mib = [](size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); };
  std::string table;
  auto row = [&](const std::string& key, const std::string& value) {
    table += fmt::format("| {:<28} | {:>22} |\n", key, value);
  };
  table += fmt::format("| {:<28} | {:>22} |\n", "summary", "");
  table += fmt::format("|{:-<30}|{:->24}|\n", "", "");
  row("steps", s.first_step > 0 ? fmt::format("{} (resumed at {})", s.steps, s.first_step)
                                : fmt::format("{}", s.steps));
  row("parameters", fmt::format("{:.2f}M", static_cast<double>(s.num_parameters) / 1e6));
  row("tokens trained", fmt::format("{}", s.tokens));
  row("first train loss", fmt::format("{:.4f}", s.first_loss));
  row("final train loss", std::isfinite(s.final_train_loss) ? fmt::format("{:.4f}", s.final_train_loss) : "-");
  row("final val loss", s.final_val_loss > 0 ? fmt::format("{:.4f}", s.final_val_loss) : "-");
  row("tokens/s", fmt::format("{:.0f}", s.tokens_per_s));
  row("wall time", fmt::format("{:.1f} s", s.wall_s));
  const auto& peak = s.memory.at("peak");
  for (auto it = peak.begin(); it != peak.end(); ++it)
    row("peak memory: " + it.key(), mib(it.value().get<size_t>()));
  row("peak memory: total", mib(s.memory.at("peak_total").get<size_t>()));
  if (!s.last_checkpoint.empty()) row("checkpoint", fs::path(s.last_checkpoint).filename().string());
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace shardlm
