#include "shardlm/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/comm/device_communicator.hpp"
#include "shardlm/comm/world.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/fault_injection.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/phase_profile.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/optim/loss_scaler.hpp"
#include "shardlm/optim/lr_schedule.hpp"
#include "shardlm/optim/optimizer.hpp"
#include "shardlm/parallel/host_placement.hpp"
#include "shardlm/parallel/owned_params.hpp"
#include "shardlm/parallel/placed_mesh.hpp"
#include "shardlm/parallel/placed_strategy.hpp"
#include "shardlm/train/batch_source.hpp"
#include "shardlm/train/checkpoint_schedule.hpp"
#include "shardlm/train/evaluation.hpp"
#include "shardlm/train/model_runner.hpp"
#include "shardlm/train/progress.hpp"
#include "shardlm/train/finite_state.hpp"
#include "shardlm/train/run_checks.hpp"
#include "shardlm/train/run_control.hpp"
#include "shardlm/train/run_directory.hpp"
#include "shardlm/train/run_records.hpp"
#include "shardlm/train/sampling.hpp"
#include "shardlm/train/step_record.hpp"
#include "shardlm/train/step_batches.hpp"
#include "shardlm/train/stop_signals.hpp"
#include "shardlm/train/thread_budget.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

// The middle value (the mean of the two middle ones for an even count); 0 for none.
double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t half = values.size() / 2;
  return values.size() % 2 == 1 ? values[half] : 0.5 * (values[half - 1] + values[half]);
}

class Trainer {
 public:
  // `locked`: the caller took the run directory's lock already (sft, before it prepares
  // the data; the same on every rank); `claim` is its handle (nullptr on ranks but 0).
  Trainer(const TrainOptions& o, Communicator& comm, bool locked = false,
          std::unique_ptr<RunDirectoryClaim> claim = nullptr)
      : o_(o), comm_(comm), locked_(locked), claim_(std::move(claim)) {}
  // The job; one that fails before the run directory holds a committed checkpoint takes
  // back what it wrote there (RunDirectoryClaim) and says so on its error's line.
  TrainSummary run();

 private:
  TrainSummary run_steps();
  // Start-up, in the order that touches nothing until the inputs check out.
  int64_t set_up();  // returns the first step to run
  void read_inputs();
  // The batch of every step: micro-batches per rank and step, and --epochs as steps.
  void set_global_batch(int global_batch);
  std::unique_ptr<CheckpointReader> find_checkpoint_to_resume();
  void build_model_and_strategy();
  int64_t load_initial_state(std::unique_ptr<CheckpointReader> resume_from);
  void open_metrics(int64_t start_step);
  void print_run_description() const;

  StepOutcome train_step(int64_t step, int64_t target_count, const Stopwatch& clock);
  // Fills this rank's micro-batches of `step`; returns the global target count and
  // what the ranks agreed on (stop, save now) in the same all-reduce.
  UnpackedTargetCount load_step_batches(int64_t step);
  // Before `step` when the ranks agreed to: a checkpoint of the steps done so far
  // (unless one was written at that step already), and the stop line.
  void save_between_steps(int64_t done, const RunControl& control, TrainSummary& summary);
  void check_replicas(int64_t done);
  double evaluate();
  void save(int64_t step, const std::string& run_dir);
  Strategy& strategy() const { return placed_->strategy(); }
  int dp_rank() const { return mesh_shape_.data_parallel_rank(rank_); }
  // Tensor parallelism: the ranks of a tensor group compute the same loss on the same
  // rows; only the first counts its loss and targets into the sums over the world.
  bool counts_loss() const { return mesh_shape_.coordinate(rank_, MeshDim::tensor) == 0; }
  void print(const std::string& text) const {
    if (is_root_) std::fputs(text.c_str(), stdout), std::fflush(stdout);
  }

  TrainOptions o_;  // a copy: --epochs resolves to --steps once the data is open
  Communicator& comm_;
  const bool is_root_ = comm_.rank() == 0;
  const int world_ = comm_.size();
  const int rank_ = comm_.rank();
  ThreadBudget threads_;
  bool locked_ = false;  // lock_run_directory() done (by the caller or set_up)
  std::unique_ptr<RunDirectoryClaim> claim_;  // rank 0: held for the job's life

  DatasetMeta meta_;
  ModelConfig config_;
  nlohmann::json trajectory_;
  int global_batch_ = 0;
  std::optional<BatchPartition> batches_;
  int accumulation_ = 1;
  std::unique_ptr<BatchSource> data_;
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<Model> model_;
  // --device: where the model and the strategy's buffers live (PlacedStrategy says how).
  Device device_{};
  Backend* backend_ = &cpu_backend();
  MeshShape mesh_shape_;
  std::unique_ptr<PlacedMesh> placed_mesh_;  // before the model: it takes the model-parallel groups
  std::unique_ptr<PlacedStrategy> placed_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<AdamWOptimizer> optimizer_;
  std::optional<LrSchedule> schedule_;
  std::optional<LossScaler> loss_scaler_;  // fp16 only
  std::unique_ptr<RunRecords> records_;  // rank 0
  std::unique_ptr<StepBatches> step_rows_;
  CheckpointSchedule checkpoints_{o_};
  bool resumed_ = false;
  // The Hugging Face directory the run started from (kept across resumes, so export
  // finds its tokenizer files and token ids).
  std::string init_from_;
  int64_t tokens_seen_ = 0;
  nlohmann::json last_save_;  // timing of the last checkpoint save, for the metrics
  int64_t start_step_ = 0;        // the first step this invocation runs
  int64_t last_saved_step_ = -1;  // step of the newest checkpoint in the run directory
  Stopwatch wall_;  // since the trainer started (restart-to-first-step, save and load times)
};

// Without --log-every, about this many progress lines per run (one per step for
// runs shorter than this).
constexpr int64_t kProgressLinesPerRun = 20;
// The ETA's step time is an exponential moving average; the newest step weighs this
// much (about five steps of memory): one slow step (an eval, a save) moves the ETA
// little, a lasting change of speed shows within a few steps.
constexpr double kEtaNewestStepWeight = 0.2;

TrainSummary Trainer::run() {
  try {
    return run_steps();
  } catch (const std::exception& e) {
    if (!claim_) throw;
    const std::vector<std::string> removed = claim_->discard_if_uncommitted();
    if (removed.empty()) throw;
    throw Error(fmt::format("{} (no checkpoint was committed: removed what this job wrote in '{}')",
                            e.what(), o_.out_dir));
  }
}

TrainSummary Trainer::run_steps() {
  const int64_t start_step = set_up();
  start_step_ = start_step;
  TrainSummary summary;
  summary.first_step = start_step;
  summary.num_parameters = config_.num_parameters();
  summary.num_trainable_parameters = config_.num_trainable_parameters();
  std::vector<double> step_tokens_per_s;
  const int64_t log_every = o_.log_every > 0 ? o_.log_every : std::max<int64_t>(1, o_.steps / kProgressLinesPerRun);
  std::unique_ptr<ProgressLine> progress;
  if (is_root_) progress = std::make_unique<ProgressLine>(o_.steps, log_every);
  Stopwatch train_clock;
  double ema_step_s = 0.0;
  double last_loss = std::nan("");
  comm_.take_counters();
  placed_->take_group_counters();
  checkpoints_.restart_clock();

  for (int64_t step = start_step; step < o_.steps; ++step) {
    take_phase_totals();  // drop what ran between steps (eval, checkpoint save)
    fault_at_step(rank_, step + 1);
    hold_for_stop_signal_if_asked(rank_, step);
    Stopwatch step_clock;
    const UnpackedTargetCount agreed = load_step_batches(step);
    if (agreed.control.stop || agreed.control.save_now) {
      save_between_steps(step, agreed.control, summary);
      take_phase_totals();
      step_clock.restart();
    }
    if (agreed.control.stop) break;
    const StepOutcome outcome = train_step(step, agreed.target_count, step_clock);
    const int64_t done = outcome.step;
    tokens_seen_ += outcome.tokens;
    step_tokens_per_s.push_back(static_cast<double>(outcome.tokens) / outcome.seconds);
    summary.tokens += outcome.tokens;
    if (step == start_step) summary.first_loss = outcome.loss;
    last_loss = outcome.loss;
    ema_step_s = (step == start_step) ? outcome.seconds
                                      : (1.0 - kEtaNewestStepWeight) * ema_step_s +
                                            kEtaNewestStepWeight * outcome.seconds;

    CommCounters comm_stats = comm_.take_counters();
    comm_stats += placed_->take_group_counters();
    StepContext context{tokens_seen_, wall_.seconds(), world_, strategy().name(), std::nullopt,
                        0, device_};
    if (loss_scaler_) {
      context.loss_scale = outcome.loss_scale;
      context.skipped_steps = loss_scaler_->skipped_steps();
    }
    nlohmann::json record = step_record(outcome, context, comm_stats, take_phase_totals());
    if (checkpoints_.evaluates_after(done)) {
      const double val_loss = evaluate();
      if (std::isfinite(val_loss)) {
        record["val_loss"] = val_loss;
        summary.final_val_loss = val_loss;
        if (progress) progress->message(fmt::format("step {}: val loss {:.4f}", done, val_loss));
      }
    }
    if (checkpoints_.saves_after(done)) {
      save(done, o_.out_dir);
      summary.last_checkpoint = checkpoints_.checkpoint_dir(done);
      if (last_save_.is_object()) record.update(last_save_);
    }
    if (records_) records_->write(record);
    if (progress && step == start_step && done < o_.steps)
      progress->message(fmt::format("step {} took {:.2f} s: about {} for the {} steps left", done,
                                    outcome.seconds,
                                    format_duration(outcome.seconds * static_cast<double>(o_.steps - done)),
                                    o_.steps - done));
    if (progress)
      progress->update(done, outcome.loss, outcome.lr,
                       static_cast<double>(outcome.tokens) / outcome.seconds,
                       ema_step_s * static_cast<double>(o_.steps - done));
  }
  if (progress) progress->finish();
  if (start_step == o_.steps && !resumed_) {
    save(start_step, o_.out_dir);  // --steps 0: the initial (or imported) state
    summary.last_checkpoint = checkpoints_.checkpoint_dir(start_step);
  }
  const double train_s = train_clock.seconds();
  summary.steps = summary.stopped.empty() ? o_.steps : last_saved_step_;
  summary.final_train_loss = last_loss;
  summary.tokens_per_s_incl_eval_save = train_s > 0 ? static_cast<double>(summary.tokens) / train_s : 0.0;
  summary.tokens_per_s = median(step_tokens_per_s);

  if (o_.sample_tokens > 0 && summary.stopped.empty()) {
    const auto tokenizer = make_tokenizer(meta_.tokenizer);
    std::vector<int32_t> prompt = tokenizer->encode(o_.sample_prompt);
    if (prompt.empty()) prompt.push_back(tokenizer->end_of_text().value_or(0));
    SamplingOptions sampling;
    sampling.num_tokens = o_.sample_tokens;
    sampling.temperature = o_.sample_temperature;
    sampling.top_k = o_.sample_top_k;
    sampling.seed = o_.seed;
    auto ids = generate(*runner_, prompt, o_.seq_len, sampling);
    summary.sample = o_.sample_prompt + tokenizer->decode(ids);
  }
  strategy().synchronize();
  summary.memory = MemoryTracker::for_device(device_).to_json();
  write_memory_by_rank(comm_, device_, o_.out_dir, claim_.get());
  summary.wall_s = wall_.seconds();
  return summary;
}

void Trainer::save_between_steps(int64_t done, const RunControl& control, TrainSummary& summary) {
  const bool written = last_saved_step_ == done;
  if (control.stop) {
    // Test-only: hold the stop open, so a test can send the second signal meanwhile.
    if (const char* delay = std::getenv("SHARDLM_TEST_STOP_DELAY_S"))
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(delay)));
  }
  if (!written) {
    save(done, o_.out_dir);
    summary.last_checkpoint = checkpoints_.checkpoint_dir(done);
  }
  checkpoints_.restart_clock();
  if (!control.stop) return;
  const int signal = stop_signal_received();
  summary.stopped = fmt::format(
      "stopped by {} at step {}: checkpoint {} {}; continue with --resume",
      signal != 0 ? signal_name(signal) : "a signal to another rank", done,
      fs::path(checkpoints_.checkpoint_dir(done)).filename().string(),
      written ? "(written before the signal) is the newest" : "written");
}

// One optimizer step: the whole step contract of docs/architecture.md, every strategy alike.
StepOutcome Trainer::train_step(int64_t step, int64_t target_count, const Stopwatch& clock) {
  SHARDLM_CHECK(target_count > 0,
                "step {} has no target tokens: every target of its rows is masked (with chat "
                "data, a --seq-len shorter than the prompts cuts off every answer)",
                step + 1);
  // fp16: the loss (so every gradient) is multiplied by the loss scale, and the
  // optimizer divides it out again through the gradient multiplier.
  const double loss_scale = loss_scaler_ ? loss_scaler_->scale() : 1.0;
  const float grad_scale = static_cast<float>(loss_scale / static_cast<double>(target_count));

  // Mixture of experts: each micro-batch's load-balancing loss (over its tokens, as
  // transformers computes it per forward) enters the step's loss as the mean over the
  // step's micro-batches on all ranks, times the config's coefficient.
  const double micro_batches =
      static_cast<double>(accumulation_) * mesh_shape_.data_parallel_size();
  const double aux_coef = model_->config().moe.aux_loss_coef();
  strategy().begin_step(accumulation_);
  double sums[2] = {0.0, 0.0};  // cross-entropy, load-balancing loss
  std::vector<double> expert_tokens;  // per expert, this rank's micro-batches
  for (int k = 0; k < accumulation_; ++k) {
    MicroBatch batch = step_rows_->micro_batch(k);
    batch.aux_loss_share = static_cast<float>(loss_scale / micro_batches);
    sums[0] += runner_->forward(batch, /*training=*/true, grad_scale);
    sums[1] += model_->last_aux_loss();
    const std::vector<double> routed = model_->last_expert_tokens();
    expert_tokens.resize(routed.size(), 0.0);
    for (size_t e = 0; e < routed.size(); ++e) expert_tokens[e] += routed[e];
    runner_->backward(batch, k);
  }
  strategy().finish_gradients();
  if (!counts_loss()) sums[0] = sums[1] = 0.0;
  // A context group's ranks hold the same load-balancing loss (the model sums its
  // statistics over the group): its first rank counts it.
  if (mesh_shape_.coordinate(rank_, MeshDim::context) != 0) sums[1] = 0.0;
  comm_.all_reduce_blocking(std::span<double>(sums, 2), ReduceOp::sum, "loss sum");
  if (!expert_tokens.empty()) {
    comm_.all_reduce_blocking(std::span<double>(expert_tokens), ReduceOp::sum, "expert tokens");
    // Ranks outside data parallelism (context, tensor) routed the same rows.
    const double copies = static_cast<double>(world_) / mesh_shape_.data_parallel_size();
    for (double& t : expert_tokens) t /= copies;
  }
  // The loss is the mean over the global batch's target tokens, not a mean of means.
  const double aux_loss = sums[1] / micro_batches;
  const double loss = sums[0] / static_cast<double>(target_count) + aux_coef * aux_loss;
  // All-reduced, so every rank sees the same (possibly non-finite) value.
  const double grad_norm = std::sqrt(strategy().global_grad_norm_squared()) / loss_scale;
  bool apply = true;
  if (loss_scaler_) {
    // An overflow anywhere (a scaled gradient beyond fp16's range) skips the step on
    // every rank and backs the scale off.
    const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
    SHARDLM_CHECK(finite || loss_scale > 1.0,
                  "training diverged at step {}: loss {} and gradient norm {} are not finite "
                  "even at loss scale {} (the last checkpoint is kept; try a lower --lr or "
                  "bf16)",
                  step + 1, loss, grad_norm, loss_scale);
    apply = loss_scaler_->update(finite);
  }
  SHARDLM_CHECK(!apply || (std::isfinite(loss) && std::isfinite(grad_norm)),
                "training diverged at step {}: loss {} and gradient norm {} (the last "
                "checkpoint is kept; try a lower --lr or a higher --warmup)",
                step + 1, loss, grad_norm);
  const float lr = schedule_->at(step);
  if (apply) {
    const float multiplier = static_cast<float>(clip_multiplier(grad_norm, o_.grad_clip) / loss_scale);
    // AdamW's step count (bias correction) counts the steps it took.
    const int64_t adam_step = step + 1 - (loss_scaler_ ? loss_scaler_->skipped_steps() : 0);
    optimizer_->step(lr, multiplier, adam_step);
  }
  strategy().after_step();
  if (o_.check_replicas) check_replicas(step + 1);
  const int64_t tokens = static_cast<int64_t>(global_batch_) * o_.seq_len;
  return {step + 1, loss, lr, grad_norm, clock.seconds(), tokens, apply, loss_scale,
          model_->config().moe.enabled() ? std::optional<double>(aux_loss) : std::nullopt,
          std::move(expert_tokens)};
}

UnpackedTargetCount Trainer::load_step_batches(int64_t step) {
  // The ranks of a context group hold the same rows: its first rank counts their targets.
  const int64_t filled = step_rows_->fill(*data_, step, dp_rank());
  const int64_t targets = mesh_shape_.coordinate(rank_, MeshDim::context) == 0 ? filled : 0;
  RunControl local;
  local.stop = stop_signal_received() != 0;
  local.save_now = is_root_ && checkpoints_.save_due(step, start_step_);
  int64_t counts[1] = {pack_target_count(counts_loss() ? targets : 0, local, world_)};
  comm_.all_reduce_blocking(std::span<int64_t>(counts, 1), ReduceOp::sum, "target count");
  return unpack_target_count(counts[0]);
}

void Trainer::check_replicas(int64_t done) {
  strategy().synchronize();
  // A test's deliberate divergence: SHARDLM_FAULT=diverge_replica=RANK changes that rank's
  // first owned parameter after every step.
  if (const auto rank = fault_value("diverge_replica"); rank && std::stoi(*rank) == rank_) {
    const OwnedSlice first = placed_->owned_state().owned(0);
    const float changed = 1000.0f + static_cast<float>(done);
    write_owned_params(first, first.begin, 1, &changed);
  }
  auto digests = comm_.all_gather_u64(placed_->replicated_params_digest(), "replica digest");
  // Each rank against the first rank that holds the same pieces: every rank when T = 1;
  // with tensor parallelism the ranks of the same tensor coordinate (the others hold
  // other pieces of the split tensors).
  const MeshDims holders{MeshDim::replicate, MeshDim::shard, MeshDim::context, MeshDim::expert,
                         MeshDim::pipeline};
  const bool split = mesh_shape_.size(MeshDim::tensor) > 1;
  for (int r = 0; r < world_; ++r) {
    const int first = mesh_shape_.group_ranks(r, holders).front();
    SHARDLM_CHECK(digests[static_cast<size_t>(r)] == digests[static_cast<size_t>(first)],
                  "replicas diverged after step {}: rank {}'s parameters differ from rank {}'s{}",
                  done, r, first,
                  split ? fmt::format(" (both hold tensor rank {}'s pieces)",
                                      mesh_shape_.coordinate(r, MeshDim::tensor))
                        : "");
  }
}

int64_t Trainer::set_up() {
  threads_ = plan_threads(comm_, o_.threads);
  omp_set_num_threads(threads_.threads);
  read_inputs();
  // Before anything in it is read or written.
  if (!locked_) claim_ = lock_run_directory(o_.out_dir, comm_);
  locked_ = true;
  std::unique_ptr<CheckpointReader> resume_from = find_checkpoint_to_resume();
  build_model_and_strategy();
  const int64_t start_step = load_initial_state(std::move(resume_from));
  SHARDLM_CHECK(start_step <= o_.steps,
                "checkpoint is at step {}, beyond --steps {} (raise --steps to train further)",
                start_step, o_.steps);
  open_metrics(start_step);
  schedule_.emplace(LrSchedule{o_.lr, o_.min_lr.value_or(o_.lr / 10.0f), o_.warmup, o_.steps});
  optimizer_ = std::make_unique<AdamWOptimizer>(*layout_, placed_->strategy_state(), o_.adamw_config(),
                                                *backend_, placed_->offloaded_optimizer());
  step_rows_ = std::make_unique<StepBatches>(*batches_, o_.seq_len, data_->has_positions());
  print_run_description();
  return start_step;
}

// Data, model shape and options, checked before anything is written; then every rank
// checks that it runs the same command on the same data as rank 0.
void Trainer::read_inputs() {
  o_.validate();
  data_ = open_batch_source(o_.data_dir, {o_.seq_len, o_.seed, o_.packing});
  meta_ = data_->meta();
  config_ = resolve_model_config(o_, static_cast<int>(meta_.vocab_size));
  check_context_parallel_model(config_, o_.context_parallel_size(),
                               parse_context_parallel_kind(o_.context_parallel_kind),
                               o_.tensor_size(), o_.ulysses_degree);
  if (!o_.init_from.empty()) check_hf_model_matches(o_.init_from, config_);
  device_ = rank_device(parse_device(o_.device, "--device"),
                        o_.device.find(':') != std::string::npos);
  backend_ = &backend_for(device_);  // a clear error now when the device is absent
  mesh_shape_ = o_.mesh_shape(world_);
  if (mesh_shape_.size(MeshDim::tensor) > 1)
    if (const std::string w = tensor_groups_across_hosts_warning(mesh_shape_, rank_hosts(comm_));
        !w.empty())
      print("warning: " + w + "\n");
  if (const int E = mesh_shape_.expert_parallel_size(); E > 1) {
    SHARDLM_CHECK(config_.moe.enabled(),
                  "--expert-parallel {}: {} is a dense model (expert parallelism spreads a "
                  "mixture of experts' experts: qwen3_moe, mixtral)", E, config_.family);
    SHARDLM_CHECK(config_.moe.num_experts % E == 0,
                  "--expert-parallel {}: the model has {} experts per layer, which {} ranks cannot "
                  "share equally (expected a divisor of {})", E, config_.moe.num_experts, E,
                  config_.moe.num_experts);
  }
  set_global_batch(o_.global_batch > 0 ? o_.global_batch
                                       : o_.micro_batch * mesh_shape_.data_parallel_size() *
                                             std::max(1, o_.grad_accum));

  make_tokenizer(meta_.tokenizer);  // the data's tokenizer must be loadable

  nlohmann::json agreement = {{"model", config_.to_json()},
                              {"options", trajectory_},
                              {"steps", o_.steps},
                              {"micro_batch", o_.micro_batch},
                              {"strategy", o_.strategy},
                              {"prefetch", o_.prefetch},
                              {"shard_group_size", o_.shard_group()},
                              {"mesh", mesh_shape_.to_json()},
                              {"min_unit_params", o_.min_unit_params},
                              {"tokenizer", meta_.tokenizer},
                              {"dataset", data_->agreement()},
                              {"world_size", world_}};
  for (const auto& src : meta_.sources) agreement["data_sha256"].push_back(src.sha256);
  check_ranks_agree(comm_, agreement);
}

void Trainer::set_global_batch(int global_batch) {
  global_batch_ = global_batch;
  // The rows a rank reads: its data-parallel rank's (the whole world today; ranks of
  // later mesh dimensions will read their group's rows).
  const int dp_size = mesh_shape_.data_parallel_size();
  SHARDLM_CHECK(global_batch_ >= dp_size,
                "{} {} is larger than the global batch of {} sequences (every data-parallel "
                "rank needs at least one sequence per step)",
                dp_size == world_ ? "world size" : "data-parallel size", dp_size, global_batch_);
  batches_.emplace(global_batch_, dp_size, o_.micro_batch);
  accumulation_ = batches_->accumulation_steps();
  if (o_.epochs > 0) {
    // Enough steps to see every row of the epochs once (the last step may run into
    // the next epoch's first rows: steps hold whole global batches).
    const int64_t rows = data_->train_rows_in_epochs(o_.epochs);
    o_.steps = (rows + global_batch_ - 1) / global_batch_;
  }
  TrainOptions resolved = o_;
  resolved.global_batch = global_batch_;
  trajectory_ = resolved.trajectory_json();
}

std::unique_ptr<CheckpointReader> Trainer::find_checkpoint_to_resume() {
  auto resume_from = checkpoint_to_resume(
      o_, [&](const std::string& warning) { print("warning: " + warning + "\n"); });
  if (!resume_from) return resume_from;
  // Without --global-batch a resumed run keeps the run's own (the default, micro-batch x
  // world size, changes with the world size); the micro-batch shrinks to a divisor of
  // the rows each rank gets when it no longer splits them (accumulation takes the rest).
  const int recorded = resume_from->info().train.at("options").value("global_batch", 0);
  if (o_.global_batch == 0 && recorded > 0 && recorded != global_batch_) {
    // The rows split over the data-parallel ranks (context and tensor ranks share theirs).
    const int dp_size = mesh_shape_.data_parallel_size();
    SHARDLM_CHECK(recorded % dp_size == 0,
                  "the run's global batch of {} sequences (from its checkpoint) does not split over {} "
                  "data-parallel ranks: resume on a mesh whose data-parallel size divides it, or pass "
                  "--global-batch",
                  recorded, dp_size);
    const int per_rank = recorded / dp_size;
    int micro = std::min(o_.micro_batch, per_rank);
    while (per_rank % micro != 0) --micro;
    print(fmt::format("global batch {} from the run's checkpoint (--global-batch not given){}\n", recorded,
                      micro != o_.micro_batch
                          ? fmt::format("; micro-batch {} -> {} so that {} data-parallel ranks split it",
                                        o_.micro_batch, micro, dp_size)
                          : ""));
    o_.micro_batch = micro;
    set_global_batch(recorded);
  }
  check_resume_compatible(*resume_from, config_, trajectory_, meta_.tokenizer);
  return resume_from;
}

void Trainer::build_model_and_strategy() {
  const int partition = partition_size(mesh_shape_);
  const TensorSplit tensor{mesh_shape_.size(MeshDim::tensor), mesh_shape_.coordinate(rank_, MeshDim::tensor)};
  layout_ = std::make_unique<ParamLayout>(
      ParamLayout::build(config_, partition, o_.min_unit_params, tensor));
  placed_mesh_ = std::make_unique<PlacedMesh>(mesh_shape_, device_, comm_);
  ModelOptions model_options = o_.model_options(device_);
  model_options.parallel_groups = placed_mesh_->model_groups();
  model_ = model_family(config_.family)
               .make_model(config_, *layout_, o_.micro_batch, o_.seq_len, model_options,
                           MemoryTracker::global());
  if (model_options.precision == DType::fp16) {
    LossScalerConfig scaler_config;
    scaler_config.initial_scale = o_.loss_scale;
    scaler_config.growth_interval = o_.loss_scale_growth_interval;
    loss_scaler_.emplace(scaler_config);
  }
  placed_ = std::make_unique<PlacedStrategy>(*layout_, model_->unit_needs(), placed_mesh_->mesh(),
                                             o_.strategy_options(), device_, *backend_);
  runner_ = std::make_unique<ModelRunner>(*model_, strategy());
}

// The checkpoint's state, or Hugging Face weights, or a fresh init; returns its step.
int64_t Trainer::load_initial_state(std::unique_ptr<CheckpointReader> resume_from) {
  resumed_ = resume_from != nullptr;
  if (resume_from) {
    last_saved_step_ = resume_from->info().step;
    Stopwatch load_clock;
    resume_from->load_into(*layout_, placed_->owned_state());
    const double load_s = load_clock.seconds();
    const CheckpointInfo& info = resume_from->info();
    tokens_seen_ = info.tokens_seen;
    init_from_ = info.train.at("options").value("init_from", std::string());
    if (loss_scaler_ && info.train.contains("loss_scaler"))
      loss_scaler_->load_json(info.train.at("loss_scaler"));
    const auto saved_steps = info.train.at("options").value("steps", int64_t{0});
    if (saved_steps != o_.steps)
      print(fmt::format("note: --steps changed from {} to {}; the cosine schedule stretches\n",
                        saved_steps, o_.steps));
    print(fmt::format("resumed from {} (step {}, written by {} x {}; loaded in {:.2f} s)\n",
                      resume_from->dir(), info.step, info.strategy, info.world_size, load_s));
    if (const auto dir = fault_value("save_after_load")) save(info.step, *dir);
    return info.step;
  }
  if (!o_.init_from.empty()) {
    init_from_ = fs::absolute(o_.init_from).string();
    // LoRA adapters start from their init (A random, B zero); the base is imported.
    for (int u = 0; u < layout_->num_units(); ++u)
      if (layout_->units[static_cast<size_t>(u)].trainable && config_.lora.enabled()) {
        init_owned_params(*model_, u, o_.seed, placed_->owned_state().owned(u));
      }
    import_hugging_face(o_.init_from, config_, *layout_, placed_->owned_state());
    print(fmt::format("initialised from {}\n", o_.init_from));
    return 0;
  }
  // Init is a function of (seed, tensor name): each rank fills its owned slices.
  for (int u = 0; u < layout_->num_units(); ++u)
    init_owned_params(*model_, u, o_.seed, placed_->owned_state().owned(u));
  placed_->owned_state().after_load();
  return 0;
}

void Trainer::open_metrics(int64_t start_step) {
  if (!is_root_) return;
  nlohmann::json run_config = {{"model", config_.to_json()},
                               {"tokenizer", meta_.tokenizer},
                               {"data", fs::absolute(o_.data_dir).string()},
                               {"options", trajectory_},
                               {"steps", o_.steps},
                               {"micro_batch", o_.micro_batch},
                               {"threads", threads_.threads},
                               {"activation_checkpointing", o_.activation_checkpointing},
                               {"strategy", strategy().name()},
                               {"reshard_after_forward", o_.reshard_after_forward},
                               {"shard_group_size", o_.shard_group()},
                               {"mesh", mesh_shape_.to_json()},
                               {"world_size", world_}};
  if (!o_.strategy_reason.empty()) run_config["strategy_auto"] = o_.strategy_reason;
  records_ = std::make_unique<RunRecords>(o_, std::move(run_config), start_step, *claim_,
                                          [&](const std::string& w) { print("warning: " + w + "\n"); });
}

void Trainer::print_run_description() const {
  print(fmt::format(
      "model {}: {} layers, {} heads, {} wide, vocab {} (padded {}), {:.2f}M parameters\n",
      model_source(o_), config_.n_layer, config_.n_head, config_.n_embd, config_.vocab_size,
      config_.padded_vocab_size(), static_cast<double>(config_.num_parameters()) / 1e6));
  print(trainable_params_line(config_.num_trainable_parameters(), config_.num_parameters()) + "\n");
  print(fmt::format("data {}: {} ({})\n", o_.data_dir, data_->describe(), meta_.tokenizer));
  print(o_.epochs > 0 ? fmt::format("steps {} ({} epoch(s) over {} rows, {} rows per step)\n", o_.steps,
                                    o_.epochs, data_->train_rows_in_epochs(1), global_batch_)
                      : fmt::format("steps {}\n", o_.steps));
  print(fmt::format("batch {} x {} tokens (micro-batch {}, {} accumulation steps); strategy {} "
                    "(mesh {}) on {} rank(s) x {} threads; {}\n",
                    global_batch_, o_.seq_len, o_.micro_batch, accumulation_, strategy().name(),
                    mesh_shape_.to_string(), world_, threads_.threads, placed_->describe()));
  print(threads_.oversubscription_warning());
  if (model_->options().precision != DType::fp32 || o_.activation_checkpointing)
    print(fmt::format("precision {}{} (fp32 master weights and gradients){}\n", o_.precision,
                      o_.precision_reason.empty() ? "" : " (" + o_.precision_reason + ")",
                      o_.activation_checkpointing ? "; activation checkpointing" : ""));
}

double Trainer::evaluate() {
  if (data_->val_rows() == 0 || o_.eval_batches == 0) return std::nan("");
  // The first eval_batches x micro_batch validation rows whatever the world size.
  EvalRows rows;
  rows.rows = std::min<int64_t>(static_cast<int64_t>(o_.eval_batches) * o_.micro_batch, data_->val_rows());
  rows.micro_batch = o_.micro_batch;
  rows.seq_len = o_.seq_len;
  rows.positions = data_->has_positions();
  rows.dp_rank = dp_rank();
  rows.dp_size = mesh_shape_.data_parallel_size();
  const EvalLoss loss = evaluate_rows(
      *runner_, rows, [&](int64_t row, const RowBuffers& out, int at) { data_->fill_val(row, out, at); });
  double sums[1] = {counts_loss() ? loss.loss_sum : 0.0};
  int64_t counts[1] = {counts_loss() ? loss.target_count : 0};
  comm_.all_reduce_blocking(std::span<double>(sums, 1), ReduceOp::sum, "eval loss sum");
  comm_.all_reduce_blocking(std::span<int64_t>(counts, 1), ReduceOp::sum, "eval target count");
  return counts[0] > 0 ? sums[0] / static_cast<double>(counts[0]) : std::nan("");
}

void Trainer::save(int64_t step, const std::string& run_dir) {
  placed_->stage_for_host();
  // A diverged state is never committed.
  check_state_finite(*layout_, placed_->owned_state(), comm_, step);
  nlohmann::json options = trajectory_;
  options["steps"] = o_.steps;
  if (!init_from_.empty()) options["init_from"] = init_from_;
  CheckpointInfo info{step, tokens_seen_, config_, meta_.tokenizer, strategy().name(), world_,
                      {{"options", options}}};
  if (loss_scaler_) info.train["loss_scaler"] = loss_scaler_->to_json();
  info.train["mesh"] = mesh_shape_.to_json();  // for information: checkpoints reshard to any mesh
  Stopwatch clock;
  const std::string dir = save_checkpoint(run_dir, *layout_, placed_->owned_state(), info, o_.keep, comm_);
  if (run_dir == o_.out_dir) last_saved_step_ = step;
  if (is_root_) {
    uintmax_t bytes = 0;
    for (const auto& entry : fs::directory_iterator(dir)) bytes += entry.file_size();
    last_save_ = {{"save_ms", clock.millis()}, {"checkpoint_bytes", bytes}};
  }
}

}  // namespace

TrainSummary run_training(const TrainOptions& options, const RunSetup& setup) {
  install_stop_signal_handlers();  // before MPI and OpenMP start threads
  CommOptions comm_options;
  comm_options.timeout_seconds = options.comm_timeout;
  auto comm = make_world_communicator(comm_options);
  announce_stop_signals(comm->rank() == 0);
  TrainSummary summary;
  try {
    SHARDLM_CHECK(options.strategy != "auto" || setup.resolve_options,
                  "internal: --strategy auto without the planner's resolve_options");
    auto resolved = [&] { return setup.resolve_options ? setup.resolve_options(options, *comm) : options; };
    if (setup.prepare_data) {
      // The run directory is this job's before anything under it is written: a second
      // job on it is refused here and changes nothing.
      std::unique_ptr<RunDirectoryClaim> claim = lock_run_directory(options.out_dir, *comm);
      if (claim && !fs::exists(options.data_dir)) claim->wrote(options.data_dir);
      if (comm->rank() == 0) setup.prepare_data();
      int64_t ready[1] = {1};  // the other ranks wait here (under --comm-timeout) for rank 0
      comm->all_reduce_blocking(std::span<int64_t>(ready, 1), ReduceOp::sum, "dataset prepared");
      summary = Trainer(resolved(), *comm, true, std::move(claim)).run();
    } else {
      summary = Trainer(resolved(), *comm).run();
    }
  } catch (const std::exception& e) {
    // One rank's error brings the whole job down (no peer left waiting).
    if (comm->size() > 1) comm->abort_job(std::string("error: ") + e.what());
    throw;
  }
  summary.is_root = comm->rank() == 0;
  comm->finalize();
  return summary;
}

}  // namespace shardlm
