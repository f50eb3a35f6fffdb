// Everything `shardlm train` can be told, with the defaults a user starts from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "shardlm/backend/adamw_config.hpp"
#include "shardlm/core/device.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/model.hpp"
#include "shardlm/parallel/mesh_shape.hpp"
#include "shardlm/parallel/strategy_options.hpp"
#include "shardlm/train/command_record.hpp"

namespace shardlm {

// --offload: where a device run keeps its optimizer state (TrainOptions::device).
enum class Offload { none, optimizer };
// "none" or "optimizer"; Error naming --offload otherwise.
Offload parse_offload(const std::string& text);

struct TrainOptions {
  // Model: a preset, or a Hugging Face model directory / config.json; empty: the
  // directory --init-from starts from, else kDefaultModelPreset. Fields may be
  // overridden one by one.
  std::string model;
  std::optional<int> n_layer, n_head, n_embd, vocab_size;
  std::optional<int> context_len;  // positions (GPT-2: rows of the position table)
  // LoRA (model/config.hpp LoraConfig): rank 0 trains every parameter. Targets: module
  // names separated by commas, or "all-linear" (every linear layer of the decoder).
  int lora_rank = 0;
  float lora_alpha = 16.0f;
  std::string lora_targets = "all-linear";
  std::string quantize_base = "none";  // none | nf4 (QLoRA; needs lora_rank > 0)

  std::string data_dir;  // from `shardlm prepare`: train.bin, val.bin, meta.json
  std::string out_dir;   // run directory: metrics.jsonl, checkpoints/

  int64_t steps = 100;  // 0: only initialise (or import) and write a step-0 checkpoint
  int64_t epochs = 0;   // > 0: steps = enough global batches for this many passes over the data
  bool packing = false;  // chat data: whole examples packed into rows instead of one per row
  int micro_batch = 8;
  int seq_len = 256;
  int global_batch = 0;  // sequences per optimizer step; 0: micro_batch x world size x grad_accum
  int grad_accum = 0;    // micro-batches per rank per step (ms-swift's gradient_accumulation_steps); 0: from global_batch

  float lr = 6e-4f;
  std::optional<float> min_lr;  // default lr / 10
  int64_t warmup = 0;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // 0 disables clipping
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  uint64_t seed = 1337;

  int64_t eval_every = 0;  // 0: evaluate at the end only
  int eval_batches = 8;
  int64_t save_every = 0;  // 0: save at the end only
  // Also a checkpoint when this many minutes have passed since the last one (rank 0's
  // clock, agreed by every rank at a step boundary); 0: off.
  double save_every_minutes = 30.0;
  int keep = 0;            // checkpoints kept; 0: all
  bool resume = false;            // must continue from a checkpoint of out_dir
  bool resume_if_exists = false;  // continue if out_dir has a committed checkpoint, else start
  std::string init_from;  // Hugging Face weights (directory or .safetensors) to start from

  // Distribution (see parallel/strategy_options.hpp). "auto": `plan`'s recommendation
  // (plan/auto_strategy.hpp) sets strategy, reshard_after_forward, shard_group_size and
  // activation_checkpointing before the run starts, and strategy_reason to why.
  std::string strategy = "ddp";
  std::optional<double> memory_per_rank_gib;  // auto's budget; default: the hosts' memory
  std::string strategy_reason;                // auto's line, recorded in config.json
  double bucket_mb = 25.0;
  int prefetch = 1;
  bool reshard_after_forward = true;
  int shard_group_size = 0;
  // --expert-parallel E: experts spread over an expert mesh dimension of E ranks, carved
  // out of data parallelism (StrategyOptions::expert_parallel); also --mesh expert=E.
  int expert_parallel = 1;
  // --mesh: the layout of the ranks, outermost first ("replicate=2,shard=4", see
  // parallel/mesh_shape.hpp); empty: the strategy's (shard=N, or for hybrid
  // replicate=N/G x shard=G, for which --shard-group-size G is the shorthand).
  std::string mesh;
  // --tensor-parallel T: every transformer block split over T ranks (the mesh's tensor
  // dimension, innermost: model/tensor_parallel/); --mesh tensor=T says the same.
  int tensor_parallel = 1;
  // --sequence-parallel: with T > 1, the residual stream and the norms hold 1/T of the
  // micro-batch's tokens on each tensor rank (ModelOptions::sequence_parallel).
  bool sequence_parallel = false;
  // --context-parallel P: each sequence is split over P ranks of the mesh's context
  // dimension (--mesh context=P says the same); they read the same rows. 1: none.
  // --context-parallel-kind: how their attention sees the whole rows (ulysses, ring,
  // hybrid); --ulysses-degree U: hybrid's Ulysses groups (U consecutive context ranks).
  int context_parallel = 1;
  std::string context_parallel_kind = "ulysses";
  int ulysses_degree = 1;
  // The expert group's size: --mesh's (expert=, times context= when its expert_group is
  // expert+context), else --expert-parallel.
  int expert_parallel_size() const;
  // Model units smaller than this are merged with a neighbour into one flat unit.
  int64_t min_unit_params = 65536;
  double comm_timeout = 300.0;  // seconds any wait on a collective may take
  bool check_replicas = false;  // debug: verify replicated params agree after every step

  // Numerics and memory (model/gpt2_model.hpp, ModelOptions). Master weights, AdamW
  // state and gradients stay fp32 whatever the precision.
  std::string precision = "fp32";         // compute type: fp32, bf16 or fp16
  std::string precision_reason;           // where a default precision came from (sft: the model's)
  std::string reduce_dtype = "fp32";      // type gradients are reduced in: fp32 or bf16
  bool activation_checkpointing = false;  // keep unit inputs only; recompute in backward
  double loss_scale = 65536.0;            // fp16: initial dynamic loss scale
  int64_t loss_scale_growth_interval = 1000;  // fp16: good steps before the scale doubles

  // Where each rank computes: cpu, cuda (one GPU per rank: the node-local rank's), or
  // emulated (a test device: backend/emulated). --offload optimizer keeps the owned fp32
  // master weights, the gradient's accumulation and AdamW state in host memory and runs
  // AdamW there (device runs; the device keeps the compute-type parameters).
  std::string device = "cpu";
  Offload offload = Offload::none;

  std::optional<int> threads;  // default: the cores this host's ranks may use, shared out
  int64_t log_every = 0;  // plain progress lines when not a terminal; 0: ~20 lines per run

  // The subcommand and its flags as run (cli/config_file.hpp): written to RUN/config.toml
  // (a file --config reads back) and config.json's "flags". Empty: not recorded.
  std::string command;
  std::vector<CommandFlag> command_flags;

  // --tensorboard: where rank 0 writes TensorBoard event files (train/tensorboard_writer);
  // empty: none. The CLI turns a bare --tensorboard into RUN/tb.
  std::string tensorboard_dir;

  int sample_tokens = 0;  // > 0: print a sample of this many tokens at the end
  std::string sample_prompt = "\n";
  float sample_temperature = 0.8f;
  int sample_top_k = 40;

  // Error naming the first flag out of range or not finite, or flags that exclude each
  // other: every range check of `train`'s flags, in one place. validate_run_shape()
  // is the part `plan` shares (model, batch, strategy, precision).
  void validate() const;
  void validate_run_shape() const;

  // Hybrid's ranks per shard group: --shard-group-size, or --mesh's shard size.
  int shard_group() const;
  // Tensor ranks: --tensor-parallel, or --mesh's tensor size.
  int tensor_size() const;
  // Ranks per context group: --context-parallel, or --mesh's context size.
  int context_parallel_size() const;
  // What the flags say to the strategy, the model (on `device`) and AdamW: the one
  // place `train`, `plan` and `--strategy auto` assemble them. --strategy auto gives
  // ddp's (the planner's candidates vary it).
  StrategyOptions strategy_options() const;
  ModelOptions model_options(Device device) const;
  AdamWConfig adamw_config() const;
  // The mesh the run's strategy runs on at `world_size` ranks (not for --strategy
  // auto): --mesh, or the strategy's own. Error naming the numbers when the mesh does
  // not lay out `world_size` ranks.
  MeshShape mesh_shape(int world_size) const;

  // The options a resumed run must share with the run that wrote the checkpoint
  // (anything that changes the trajectory; --steps may grow, which only stretches
  // the cosine schedule, and is reported).
  nlohmann::json trajectory_json() const;

 private:
  void validate_mesh() const;
  void validate_context_parallel() const;  // --context-parallel against --mesh, --seq-len  // --mesh's spelling, dimensions and agreement with --strategy
};

inline constexpr const char* kDefaultModelPreset = "gpt2-small-30m";

// Where the model's shape comes from: --model, else --init-from's directory when it is
// a Hugging Face model directory, else the default preset.
std::string model_source(const TrainOptions& o);

// The model a run trains: the preset or Hugging Face config with the flags'
// overrides. GPT-2 and tiny presets take the data's vocabulary unless --vocab-size
// widens it; real models keep theirs. Without data (plan), every model keeps its own.
// Error when the result is invalid, narrower than the data's vocabulary, or --seq-len
// exceeds its context.
ModelConfig resolve_model_config(const TrainOptions& o, std::optional<int> data_vocab_size);

}  // namespace shardlm
