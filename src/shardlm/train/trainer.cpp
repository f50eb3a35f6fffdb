#include "shardlm/train/trainer.hpp"

#include <omp.h>
#include <sched.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/timer.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sampler.hpp"
#include "shardlm/data/token_file.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/model/gpt2_model.hpp"
#include "shardlm/optim/adamw.hpp"
#include "shardlm/optim/lr_schedule.hpp"
#include "shardlm/parallel/single_process_strategy.hpp"
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

ModelConfig resolve_model_config(const TrainOptions& o, int data_vocab_size) {
  ModelConfig config = model_preset(o.model);
  if (o.n_layer) config.n_layer = *o.n_layer;
  if (o.n_head) config.n_head = *o.n_head;
  if (o.n_embd) config.n_embd = *o.n_embd;
  config.vocab_size = o.vocab_size.value_or(data_vocab_size);
  config.validate();
  SHARDLM_CHECK(config.vocab_size >= data_vocab_size,
                "--vocab-size {} is smaller than the data's vocabulary ({} from meta.json)",
                config.vocab_size, data_vocab_size);
  return config;
}

void validate_options(const TrainOptions& o, const ModelConfig& config) {
  SHARDLM_CHECK(o.steps > 0, "--steps must be positive, got {}", o.steps);
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
  SHARDLM_CHECK(!o.out_dir.empty(), "--out is required (the run directory)");
}

// Compares the options that fix a run's trajectory against a checkpoint's.
void check_resume_compatible(const CheckpointReader& ckpt, const ModelConfig& config,
                             const TrainOptions& o, const std::string& tokenizer) {
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
  auto wanted = o.trajectory_json();
  const auto& saved_train = saved.train.at("options");
  for (auto it = wanted.begin(); it != wanted.end(); ++it)
    SHARDLM_CHECK(saved_train.value(it.key(), nlohmann::json()) == it.value(),
                  "checkpoint '{}' was trained with {}={}, but this run asks for {} (resume "
                  "needs the same value)",
                  ckpt.dir(), it.key(), saved_train.value(it.key(), nlohmann::json()).dump(),
                  it.value().dump());
}

}  // namespace

TrainSummary run_training(const TrainOptions& o) {
  Stopwatch wall;
  const int threads = o.threads > 0 ? o.threads : available_cores();
  omp_set_num_threads(threads);

  // Inputs first: nothing in the run directory is touched until they check out.
  const DatasetMeta meta = read_dataset_meta(o.data_dir);
  const ModelConfig config = resolve_model_config(o, static_cast<int>(meta.vocab_size));
  validate_options(o, config);
  const int world_size = 1;
  const int global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * world_size;
  SHARDLM_CHECK(global_batch % (o.micro_batch * world_size) == 0,
                "--global-batch {} is not divisible by --micro-batch {} x world size {}",
                global_batch, o.micro_batch, world_size);
  const int accumulation = global_batch / (o.micro_batch * world_size);
  TrainOptions resolved = o;
  resolved.global_batch = global_batch;

  TokenFile train_tokens((fs::path(o.data_dir) / "train.bin").string());
  TokenFile val_tokens((fs::path(o.data_dir) / "val.bin").string());
  SHARDLM_CHECK(train_tokens.vocab_size() <= config.vocab_size,
                "'{}' holds token ids up to vocab {} but the model's vocabulary is {}",
                train_tokens.path(), train_tokens.vocab_size(), config.vocab_size);
  BatchSampler train_sampler(train_tokens, o.seq_len, o.seed);
  std::unique_ptr<EvalSampler> val_sampler;
  if (val_tokens.size() > o.seq_len)
    val_sampler = std::make_unique<EvalSampler>(val_tokens, o.seq_len);
  auto tokenizer = make_tokenizer(meta.tokenizer);

  std::optional<std::string> existing = latest_checkpoint(o.out_dir);
  SHARDLM_CHECK(!existing || o.resume,
                "run directory '{}' already holds a run (checkpoint '{}'); pass --resume to "
                "continue it or choose another --out",
                o.out_dir, existing.value_or(""));
  std::unique_ptr<CheckpointReader> resume_from;
  if (existing) {
    resume_from = std::make_unique<CheckpointReader>(*existing);
    check_resume_compatible(*resume_from, config, resolved, meta.tokenizer);
  }

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  SHARDLM_CHECK(!ec, "cannot create run directory '{}': {}", o.out_dir, ec.message());

  const ParamLayout layout = ParamLayout::build(config, world_size);
  SingleProcessStrategy strategy(layout);
  Gpt2Model model(config, layout, o.micro_batch, o.seq_len);
  ModelRunner runner(model, strategy);

  int64_t start_step = 0;
  int64_t tokens_seen = 0;
  if (resume_from) {
    resume_from->load_into(layout, strategy);
    start_step = resume_from->info().step;
    tokens_seen = resume_from->info().tokens_seen;
    auto saved_steps = resume_from->info().train.at("options").value("steps", int64_t{0});
    if (saved_steps != o.steps)
      std::printf("note: --steps changed from %lld to %lld; the cosine schedule stretches\n",
                  static_cast<long long>(saved_steps), static_cast<long long>(o.steps));
    std::printf("resumed from %s (step %lld)\n", resume_from->dir().c_str(),
                static_cast<long long>(start_step));
  } else {
    for (int u = 0; u < layout.num_units(); ++u)
      model.init_unit(u, o.seed, strategy.owned(u).master);
    strategy.after_load();
  }
  SHARDLM_CHECK(start_step <= o.steps,
                "checkpoint is at step {}, beyond --steps {} (raise --steps to train further)",
                start_step, o.steps);

  {
    nlohmann::json run_config = {{"model", config.to_json()},
                                 {"tokenizer", meta.tokenizer},
                                 {"data", fs::absolute(o.data_dir).string()},
                                 {"options", resolved.trajectory_json()},
                                 {"steps", o.steps},
                                 {"micro_batch", o.micro_batch},
                                 {"threads", threads},
                                 {"strategy", strategy.name()},
                                 {"world_size", world_size}};
    write_file_atomic((fs::path(o.out_dir) / "config.json").string(), run_config.dump(2) + "\n");
  }
  MetricsWriter metrics((fs::path(o.out_dir) / "metrics.jsonl").string());

  const LrSchedule schedule{o.lr, o.min_lr.value_or(o.lr / 10.0f), o.warmup, o.steps};
  const AdamWConfig adam{o.beta1, o.beta2, 1e-8f, o.weight_decay};
  std::vector<std::vector<ElementRange>> decay_ranges;
  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice s = strategy.owned(u);
    decay_ranges.push_back(weight_decay_ranges(layout.units[static_cast<size_t>(u)], s.begin, s.end));
  }

  // Token buffers for every micro-batch of a step, allocated once.
  const size_t micro_tokens = static_cast<size_t>(o.micro_batch) * static_cast<size_t>(o.seq_len);
  std::vector<int32_t> tokens(micro_tokens * static_cast<size_t>(accumulation));
  std::vector<int32_t> targets(tokens.size());

  auto evaluate = [&]() -> double {
    if (!val_sampler || o.eval_batches == 0) return std::nan("");
    double loss_sum = 0.0;
    int64_t count = 0;
    std::vector<int32_t> eval_tokens(micro_tokens), eval_targets(micro_tokens);
    for (int b = 0; b < o.eval_batches; ++b) {
      const int64_t first = static_cast<int64_t>(b) * o.micro_batch;
      if (first + o.micro_batch > val_sampler->num_windows()) break;
      for (int i = 0; i < o.micro_batch; ++i)
        val_sampler->fill(first + i, eval_tokens.data() + static_cast<size_t>(i) * o.seq_len,
                          eval_targets.data() + static_cast<size_t>(i) * o.seq_len);
      MicroBatch batch{eval_tokens.data(), eval_targets.data(), o.micro_batch, o.seq_len};
      loss_sum += runner.forward(batch, /*training=*/false, 0.0f);
      count += model.last_target_count();
    }
    return count > 0 ? loss_sum / static_cast<double>(count) : std::nan("");
  };

  std::printf("model %s: %d layers, %d heads, %d wide, vocab %d (padded %d), %.2fM parameters\n",
              o.model.c_str(), config.n_layer, config.n_head, config.n_embd, config.vocab_size,
              config.padded_vocab_size(), static_cast<double>(config.num_parameters()) / 1e6);
  std::printf("data %s: %lld train / %lld val tokens (%s)\n", o.data_dir.c_str(),
              static_cast<long long>(train_tokens.size()),
              static_cast<long long>(val_tokens.size()), meta.tokenizer.c_str());
  std::printf("batch %d x %d tokens (micro-batch %d, %d accumulation steps); %d threads; GEMM %s\n",
              global_batch, o.seq_len, o.micro_batch, accumulation, threads,
              cpu::gemm_library_name());
  std::fflush(stdout);

  TrainSummary summary;
  summary.first_step = start_step;
  summary.num_parameters = config.num_parameters();
  const int64_t log_every = o.log_every > 0 ? o.log_every : std::max<int64_t>(1, o.steps / 20);
  ProgressLine progress(o.steps, log_every);
  Stopwatch train_clock;
  double ema_step_s = 0.0;
  const int64_t tokens_per_step = static_cast<int64_t>(global_batch) * o.seq_len;
  double last_loss = std::nan("");

  for (int64_t step = start_step; step < o.steps; ++step) {
    Stopwatch step_clock;
    const int64_t first_sample = step * global_batch;
    int64_t target_count = 0;
    train_sampler.fill_batch(first_sample, global_batch, tokens.data(), targets.data());
    for (int32_t t : targets) target_count += (t != kIgnoreIndex);
    SHARDLM_CHECK(target_count > 0, "step {} has no target tokens (all ignored)", step);
    const float grad_scale = 1.0f / static_cast<float>(target_count);

    strategy.begin_step(accumulation);
    double loss_sum = 0.0;
    for (int k = 0; k < accumulation; ++k) {
      MicroBatch batch{tokens.data() + micro_tokens * static_cast<size_t>(k),
                       targets.data() + micro_tokens * static_cast<size_t>(k), o.micro_batch,
                       o.seq_len};
      loss_sum += runner.forward(batch, /*training=*/true, grad_scale);
      runner.backward(batch, k);
    }
    strategy.finish_gradients();
    const double loss = loss_sum / static_cast<double>(target_count);
    const double grad_norm = std::sqrt(strategy.global_grad_norm_squared());
    SHARDLM_CHECK(std::isfinite(loss) && std::isfinite(grad_norm),
                  "training diverged at step {}: loss {} and gradient norm {} (the last "
                  "checkpoint is kept; try a lower --lr or a higher --warmup)",
                  step + 1, loss, grad_norm);
    const float multiplier = clip_multiplier(grad_norm, o.grad_clip);
    const float lr = schedule.at(step);
    for (int u = 0; u < layout.num_units(); ++u) {
      OwnedSlice s = strategy.owned(u);
      adamw_update(s.master, s.grad, s.adam_m, s.adam_v, s.size(),
                   decay_ranges[static_cast<size_t>(u)], lr, multiplier, step + 1, adam);
    }
    strategy.after_step();
    tokens_seen += tokens_per_step;
    summary.tokens += tokens_per_step;
    if (step == start_step) summary.first_loss = loss;
    last_loss = loss;

    const int64_t done = step + 1;
    const double step_s = step_clock.seconds();
    ema_step_s = (step == start_step) ? step_s : 0.8 * ema_step_s + 0.2 * step_s;
    nlohmann::json record = {{"step", done},
                             {"loss", loss},
                             {"lr", lr},
                             {"grad_norm", grad_norm},
                             {"tokens_per_s", static_cast<double>(tokens_per_step) / step_s},
                             {"step_ms", step_s * 1e3},
                             {"tokens_seen", tokens_seen},
                             {"mem", MemoryTracker::global().to_json()}};
    if ((o.eval_every > 0 && done % o.eval_every == 0) || done == o.steps) {
      double val_loss = evaluate();
      if (std::isfinite(val_loss)) {
        record["val_loss"] = val_loss;
        summary.final_val_loss = val_loss;
        progress.message(fmt::format("step {}: val loss {:.4f}", done, val_loss));
      }
    }
    metrics.write(record);
    progress.update(done, loss, lr, static_cast<double>(tokens_per_step) / step_s,
                    ema_step_s * static_cast<double>(o.steps - done));

    if ((o.save_every > 0 && done % o.save_every == 0) || done == o.steps) {
      CheckpointInfo info{done, tokens_seen, config, meta.tokenizer, strategy.name(), world_size,
                          {{"options", resolved.trajectory_json()}}};
      info.train["options"]["steps"] = o.steps;
      summary.last_checkpoint = save_checkpoint(o.out_dir, layout, strategy, info, o.keep);
    }
  }
  progress.finish();
  const double train_s = train_clock.seconds();
  summary.steps = o.steps;
  summary.final_train_loss = last_loss;
  summary.tokens_per_s = train_s > 0 ? static_cast<double>(summary.tokens) / train_s : 0.0;

  if (o.sample_tokens > 0) {
    std::vector<int32_t> prompt = tokenizer->encode(o.sample_prompt);
    if (prompt.empty()) prompt.push_back(tokenizer->end_of_text().value_or(0));
    SamplingOptions sampling{o.sample_tokens, o.sample_temperature, o.sample_top_k, o.seed};
    auto ids = generate(runner, prompt, o.seq_len, sampling);
    summary.sample = o.sample_prompt + tokenizer->decode(ids);
  }
  summary.memory = MemoryTracker::global().to_json();
  summary.wall_s = wall.seconds();
  return summary;
}

void print_summary(const TrainSummary& s) {
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
  row("final train loss", fmt::format("{:.4f}", s.final_train_loss));
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
