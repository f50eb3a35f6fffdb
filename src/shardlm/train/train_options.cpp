#include "shardlm/train/train_options.hpp"

#include "shardlm/core/device.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/core/device.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"
#include "shardlm/model/context_parallel/context_attention.hpp"
#include "shardlm/model/context_parallel/context_split.hpp"
#include "shardlm/parallel/strategy_options.hpp"

namespace shardlm {

namespace fs = std::filesystem;

std::string model_source(const TrainOptions& o) {
  if (!o.model.empty()) return o.model;
  if (!o.init_from.empty()) {
    const std::filesystem::path p(o.init_from);
    const std::string dir = std::filesystem::is_directory(p) ? p.string() : p.parent_path().string();
    if (is_hf_model_path(dir)) return dir;
  }
  return kDefaultModelPreset;
}

namespace {

LoraConfig lora_config(const TrainOptions& o, const std::string& family) {
  LoraConfig lora;
  lora.rank = o.lora_rank;
  lora.alpha = o.lora_alpha;
  if (o.lora_targets == "all-linear") {
    // Every linear layer of the decoder (PEFT's "all-linear" leaves the LM head out too).
    // Of a mixture of experts, the attention: PEFT 0.21's all-linear adds family-specific
    // choices there (routers, experts at rank 2 r, shared experts; docs/models.md), so
    // the experts are named explicitly (experts.gate_up_proj, experts.down_proj).
    if (family == "qwen3_moe" || family == "qwen2_moe" || family == "mixtral")
      lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
    else if (family != "gpt2")
      lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  } else {
    size_t start = 0;
    while (start <= o.lora_targets.size()) {
      const size_t comma = std::min(o.lora_targets.find(',', start), o.lora_targets.size());
      const std::string name = o.lora_targets.substr(start, comma - start);
      SHARDLM_CHECK(!name.empty(), "--lora-targets '{}' has an empty name (expected all-linear or "
                    "module names separated by commas)", o.lora_targets);
      lora.targets.push_back(name);
      start = comma + 1;
    }
  }
  return lora;
}

}  // namespace

ModelConfig resolve_model_config(const TrainOptions& o, std::optional<int> data_vocab_size) {
  const std::string source = model_source(o);
  const bool from_hf = is_hf_model_path(source);
  // A path or a hub id ("Qwen/Qwen2.5-0.5B-Instruct") that is no model directory here is
  // named as such; any other unknown name is an unknown preset (model_preset says so).
  if (!from_hf && (source.find('/') != std::string::npos || fs::exists(source))) {
    const auto presets = model_preset_names();
    if (std::find(presets.begin(), presets.end(), source) == presets.end()) {
      const std::string what =
          fs::is_directory(source) ? "a directory without config.json, not a Hugging Face model directory"
                                   : "not a local model directory or a preset";
      throw Error(fmt::format("model '{}': {} (shardlm does not download models: download it first, "
                              "e.g. `huggingface-cli download {} --local-dir DIR`; presets: {})",
                              source, what, source, fmt::join(presets, ", ")));
    }
  }
  ModelConfig config = from_hf ? read_hf_model_config(source) : model_preset(source);
  if (o.n_layer) config.n_layer = *o.n_layer;
  if (o.n_head) config.n_head = *o.n_head;
  if (o.n_embd) config.n_embd = *o.n_embd;
  if (o.context_len) config.max_seq_len = *o.context_len;
  SHARDLM_CHECK(o.lora_rank >= 0, "--lora-rank must be >= 0 (0: no adapters), got {}", o.lora_rank);
  if (o.lora_rank > 0) config.lora = lora_config(o, config.family);
  config.quantize_base = parse_base_quant(o.quantize_base);
  // GPT-2 and the tiny test presets take the data's vocabulary; a real model's shape
  // (a preset of one, or a Hugging Face config) keeps its own, which the data must fit.
  const bool follows_data = data_vocab_size && !from_hf && preset_vocabulary_follows_data(source);
  config.vocab_size =
      o.vocab_size.value_or(follows_data ? *data_vocab_size : config.vocab_size);
  config.validate();
  if (data_vocab_size && config.vocab_size < *data_vocab_size) {
    SHARDLM_CHECK(!o.vocab_size, "--vocab-size {} is smaller than the data's vocabulary ({} from "
                  "meta.json)", config.vocab_size, *data_vocab_size);
    throw Error(fmt::format("model '{}' has a vocabulary of {}, smaller than the data's ({} from "
                            "meta.json): prepare the data with the model's tokenizer",
                            source, config.vocab_size, *data_vocab_size));
  }
  SHARDLM_CHECK(o.seq_len <= config.max_seq_len,
                "--seq-len {} is longer than the model's context ({} positions; --context-len "
                "sets it)",
                o.seq_len, config.max_seq_len);
  check_tensor_parallel(config, o.tensor_size());
  return config;
}

namespace {

// One-line errors naming the flag and the range it must be in.
template <typename T>
void check_at_least(const char* flag, T value, T min) {
  SHARDLM_CHECK(value >= min, "{} must be >= {}, got {}", flag, min, value);
}

// `in_range` is the flag's condition; `range` says it to the user ("in [0, 1)", "> 0").
template <typename T>
void check_finite(const char* flag, T value, bool in_range, const char* range) {
  SHARDLM_CHECK(std::isfinite(static_cast<double>(value)) && in_range,
                "{} must be a finite number {}, got {}", flag, range, value);
}

}  // namespace

void TrainOptions::validate_run_shape() const {
  for (const auto& [flag, value] : {std::pair{"--n-layer", n_layer}, std::pair{"--n-head", n_head},
                                    std::pair{"--n-embd", n_embd}, std::pair{"--vocab-size", vocab_size},
                                    std::pair{"--context-len", context_len}})
    if (value) check_at_least(flag, *value, 1);
  check_at_least("--micro-batch", micro_batch, 1);
  check_at_least("--seq-len", seq_len, 1);
  SHARDLM_CHECK(global_batch >= 0, "--global-batch must be >= 1, got {}", global_batch);
  SHARDLM_CHECK(grad_accum >= 0, "--grad-accum must be >= 1, got {}", grad_accum);
  SHARDLM_CHECK(grad_accum == 0 || global_batch == 0,
                "--grad-accum {} and --global-batch {}: give one of them (the global batch is "
                "micro-batch x world size x grad-accum)", grad_accum, global_batch);
  check_finite("--bucket-mb", bucket_mb, bucket_mb > 0, "> 0 (MiB)");
  check_at_least("--prefetch", prefetch, 0);
  check_at_least("--min-unit-params", min_unit_params, int64_t{0});
  validate_context_parallel();
  // `plan --strategy auto` considers hybrid among others.
  const bool hybrid = strategy == "auto" || parse_strategy_kind(strategy) == StrategyKind::hybrid;
  if (strategy != "auto" && hybrid && mesh.empty())
    check_at_least("--shard-group-size", shard_group_size, 1);
  SHARDLM_CHECK(hybrid || shard_group_size == 0,
                "--shard-group-size applies to --strategy hybrid only (this run uses {})",
                strategy);
  check_at_least("--tensor-parallel", tensor_parallel, 1);
  check_at_least("--expert-parallel", expert_parallel, 1);
  if (!mesh.empty()) validate_mesh();
  // --strategy auto gives it to the tensor-parallel layouts it considers.
  SHARDLM_CHECK(!sequence_parallel || tensor_size() > 1 || strategy == "auto",
                "--sequence-parallel splits the tokens of a tensor group; this run has one tensor "
                "rank (add --tensor-parallel T with T > 1)");
  SHARDLM_CHECK(!sequence_parallel ||
                    static_cast<int64_t>(micro_batch) * seq_len / context_parallel_size() % tensor_size() == 0,
                "--sequence-parallel: the {} tokens of a rank's micro-batch (--micro-batch {} x "
                "--seq-len {}{}) must divide into --tensor-parallel {} equal parts",
                static_cast<int64_t>(micro_batch) * seq_len / context_parallel_size(), micro_batch,
                seq_len, context_parallel_size() > 1 ? " / --context-parallel" : "", tensor_size());
  parse_dtype(precision, "--precision");
  const Device run_device = parse_device(device, "--device");
  SHARDLM_CHECK(offload == Offload::none || !run_device.is_host(),
                "--offload optimizer moves the optimizer state from the device into host "
                "memory; with --device cpu it is in host memory already (use --device cuda)");
  SHARDLM_CHECK(reduce_dtype == "fp32" || reduce_dtype == "bf16",
                "--reduce-dtype must be fp32 or bf16, got '{}'", reduce_dtype);
}

void TrainOptions::validate_context_parallel() const {
  check_at_least("--context-parallel", context_parallel, 1);
  const ContextParallelKind kind = parse_context_parallel_kind(context_parallel_kind);
  if (!mesh.empty() && context_parallel > 1) {
    const int in_mesh = MeshShape::parse(mesh).size(MeshDim::context);
    SHARDLM_CHECK(in_mesh == context_parallel,
                  "--context-parallel {} and --mesh {} (context={}) disagree: give one of them",
                  context_parallel, mesh, in_mesh);
  }
  const int P = context_parallel_size();
  check_at_least("--ulysses-degree", ulysses_degree, 1);
  if (kind != ContextParallelKind::hybrid) check_ulysses_degree(P, kind, ulysses_degree);
  if (P == 1) return;
  check_ulysses_degree(P, kind, ulysses_degree);
  SHARDLM_CHECK(strategy != "auto",
                "--strategy auto does not choose a layout with --context-parallel yet: name the "
                "strategy (ddp, zero1, zero2, zero3 or hybrid)");
  ContextSplit(0, P, zigzag_split(kind), split_ulysses_degree(kind, ulysses_degree)).check_seq_len(seq_len);
}

void TrainOptions::validate_mesh() const {
  const MeshShape m = MeshShape::parse(mesh);
  for (MeshDim d : {MeshDim::pipeline})
    SHARDLM_CHECK(m.size(d) == 1,
                  "--mesh {}: {} parallelism is not there yet (the dimensions today: replicate, "
                  "shard, expert, context, tensor)",
                  mesh, mesh_dim_name(d));
  SHARDLM_CHECK(expert_parallel == 1 || expert_parallel == m.expert_parallel_size(),
                "--mesh {} has an expert group of {} rank(s), --expert-parallel says {}", mesh,
                m.expert_parallel_size(), expert_parallel);
  // The expert group takes in the context ranks only where the data-parallel ranks
  // cannot hold it (strategy_mesh's rule): one layout per E.
  SHARDLM_CHECK(!m.expert_spans_context() || m.data_parallel_size() % m.expert_parallel_size() != 0,
                "--mesh {}: an expert group of {} fits the {} data-parallel ranks (spell it "
                "expert={} without expert_group; it spans the context ranks only beyond them)",
                mesh, m.expert_parallel_size(), m.data_parallel_size(), m.expert_parallel_size());
  SHARDLM_CHECK(strategy != "auto",
                "--mesh fixes the layout that --strategy auto chooses: give one of them");
  SHARDLM_CHECK(tensor_parallel == 1 || tensor_parallel == m.size(MeshDim::tensor),
                "--mesh {} has {} tensor rank(s), --tensor-parallel says {}", mesh,
                m.size(MeshDim::tensor), tensor_parallel);
  const int replicas = m.size(MeshDim::replicate);
  const int shards = m.size(MeshDim::shard) * m.size(MeshDim::expert);
  if (parse_strategy_kind(strategy) == StrategyKind::hybrid) {
    SHARDLM_CHECK(shard_group_size == 0 || shard_group_size == shards,
                  "--mesh {} has shard groups of {} ranks, --shard-group-size says {}", mesh,
                  shards, shard_group_size);
  } else {
    SHARDLM_CHECK(replicas == 1,
                  "--mesh {} replicates over {} groups of {} sharded ranks, which is --strategy "
                  "hybrid (this run uses {}, whose mesh is shard=N)",
                  mesh, replicas, shards, strategy);
  }
}

Offload parse_offload(const std::string& text) {
  if (text == "none") return Offload::none;
  if (text == "optimizer") return Offload::optimizer;
  throw Error(fmt::format("--offload must be none or optimizer, got '{}'", text));
}

StrategyOptions TrainOptions::strategy_options() const {
  const DType compute = parse_dtype(precision, "--precision");
  StrategyOptions s;
  s.kind = strategy == "auto" ? StrategyKind::ddp : parse_strategy_kind(strategy);
  s.bucket_mb = bucket_mb;
  s.prefetch = prefetch;
  s.reshard_after_forward = reshard_after_forward;
  s.shard_group_size = shard_group();
  s.param_dtype = compute;
  s.reduce_dtype = parse_dtype(reduce_dtype, "--reduce-dtype");
  s.optimizer_on_host = offload == Offload::optimizer;
  s.context_parallel = context_parallel_size();
  s.expert_parallel = expert_parallel_size();
  s.tensor_parallel = tensor_size();
  return s;
}

int TrainOptions::expert_parallel_size() const {
  return mesh.empty() ? expert_parallel : MeshShape::parse(mesh).expert_parallel_size();
}

ModelOptions TrainOptions::model_options(Device device) const {
  ModelOptions m;
  m.precision = parse_dtype(precision, "--precision");
  m.activation_checkpointing = activation_checkpointing;
  m.device = device;
  m.context_parallel_kind = parse_context_parallel_kind(context_parallel_kind);
  m.ulysses_degree = ulysses_degree;
  m.sequence_parallel = sequence_parallel;
  return m;
}

AdamWConfig TrainOptions::adamw_config() const {
  AdamWConfig adam;  // epsilon: AdamWConfig's (there is no flag for it)
  adam.beta1 = beta1;
  adam.beta2 = beta2;
  adam.weight_decay = weight_decay;
  return adam;
}

int TrainOptions::shard_group() const {
  // (With expert parallelism a shard group's data-parallel ranks are shard x expert, the
  // expert dimension's coordinates whether or not the expert group spans the context ranks.)
  if (!mesh.empty() && strategy != "auto" && parse_strategy_kind(strategy) == StrategyKind::hybrid) {
    const MeshShape m = MeshShape::parse(mesh);
    return m.size(MeshDim::shard) * m.size(MeshDim::expert);
  }
  return shard_group_size;
}

int TrainOptions::tensor_size() const {
  return mesh.empty() ? tensor_parallel : MeshShape::parse(mesh).size(MeshDim::tensor);
}

int TrainOptions::context_parallel_size() const {
  if (!mesh.empty()) return MeshShape::parse(mesh).size(MeshDim::context);
  return context_parallel;
}

MeshShape TrainOptions::mesh_shape(int world_size) const {
  if (mesh.empty()) {
    StrategyOptions o;
    o.kind = parse_strategy_kind(strategy);
    o.shard_group_size = shard_group();
    o.context_parallel = context_parallel;
    o.expert_parallel = expert_parallel;
    o.tensor_parallel = tensor_parallel;
    return strategy_mesh(o, world_size);
  }
  const MeshShape m = MeshShape::parse(mesh);
  m.check_world(world_size);
  return m;
}

void TrainOptions::validate() const {
  SHARDLM_CHECK(!data_dir.empty(), "--data is required (a directory written by `shardlm prepare`)");
  SHARDLM_CHECK(!out_dir.empty(), "--out is required (the run directory)");
  validate_run_shape();
  if (strategy != "auto") parse_strategy_kind(strategy);  // auto: resolved before the run
  if (memory_per_rank_gib)
    check_finite("--memory-per-rank", *memory_per_rank_gib, *memory_per_rank_gib > 0, "> 0 (GiB)");
  SHARDLM_CHECK(!memory_per_rank_gib || strategy == "auto",
                "--memory-per-rank is the budget of --strategy auto (this run uses {})", strategy);
  check_at_least("--steps", steps, int64_t{0});
  check_at_least("--epochs", epochs, int64_t{0});
  check_finite("--lr", lr, lr > 0, "> 0");
  if (min_lr) check_finite("--min-lr", *min_lr, *min_lr >= 0 && *min_lr <= lr, "in [0, --lr]");
  check_at_least("--warmup", warmup, int64_t{0});
  check_finite("--weight-decay", weight_decay, weight_decay >= 0, ">= 0");
  check_finite("--grad-clip", grad_clip, grad_clip >= 0, ">= 0 (0: off)");
  check_finite("--beta1", beta1, beta1 >= 0 && beta1 < 1, "in [0, 1)");
  check_finite("--beta2", beta2, beta2 >= 0 && beta2 < 1, "in [0, 1)");
  check_at_least("--eval-every", eval_every, int64_t{0});
  check_at_least("--eval-batches", eval_batches, 0);
  check_at_least("--save-every", save_every, int64_t{0});
  check_finite("--save-every-minutes", save_every_minutes, save_every_minutes >= 0, ">= 0 (0: off)");
  check_at_least("--keep", keep, 0);
  SHARDLM_CHECK(!(resume && resume_if_exists),
                "--resume (must resume) and --resume-if-exists (resume when there is a "
                "checkpoint) exclude each other");
  SHARDLM_CHECK(init_from.empty() || !resume,
                "--init-from and --resume exclude each other (a resumed run continues from its "
                "checkpoint; --resume-if-exists imports only when there is none)");
  check_finite("--comm-timeout", comm_timeout, comm_timeout > 0, "> 0 (seconds)");
  check_finite("--loss-scale", loss_scale, loss_scale > 0, "> 0");
  check_at_least("--loss-scale-growth-interval", loss_scale_growth_interval, int64_t{1});
  if (threads) check_at_least("--threads", *threads, 1);
  check_at_least("--log-every", log_every, int64_t{0});
  check_at_least("--sample-tokens", sample_tokens, 0);
  SHARDLM_CHECK(sample_tokens == 0 || context_parallel_size() == 1,
                "--sample-tokens generates with a KV cache on one rank; a run with "
                "--context-parallel {} splits its sequences (sample afterwards with `shardlm "
                "sample`)",
                context_parallel_size());
  SHARDLM_CHECK(sample_tokens == 0 || !sequence_parallel,
                "--sample-tokens generates with a KV cache, which does not split its tokens; a "
                "run with --sequence-parallel cannot (sample afterwards with `shardlm sample`)");
  check_finite("sample temperature", sample_temperature, sample_temperature >= 0, ">= 0");
  check_at_least("sample top-k", sample_top_k, 0);
}

nlohmann::json TrainOptions::trajectory_json() const {
  nlohmann::json j = {{"seq_len", seq_len},     {"global_batch", global_batch},
                      {"lr", lr},               {"min_lr", min_lr.value_or(lr / 10.0f)},
                      {"warmup", warmup},       {"weight_decay", weight_decay},
                      {"grad_clip", grad_clip}, {"beta1", beta1},
                      {"beta2", beta2},         {"seed", seed},
                      {"precision", precision}, {"reduce_dtype", reduce_dtype}};
  if (packing) j["packing"] = true;  // absent for unpacked runs (older checkpoints have none)
  if (precision == "fp16") {
    j["loss_scale"] = loss_scale;
    j["loss_scale_growth_interval"] = loss_scale_growth_interval;
  }
  return j;
}

}  // namespace shardlm
