#include <cstdio>
#include <filesystem>
#include <memory>

#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/config_file.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/plan/auto_strategy.hpp"
#include "shardlm/train/trainer.hpp"

namespace shardlm::cli {

void register_train(CLI::App& app) {
  auto opts = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand("train", "Train a model on prepared token files");
  // A repeated flag takes its last value, so a base command line can be overridden.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--data", opts->data_dir, "Directory written by `shardlm prepare`")->required();
  cmd->add_option("--out", opts->out_dir, "Run directory (metrics, checkpoints)")->required();
  add_run_shape_flags(*cmd, *opts);
  add_run_flags(*cmd, *opts);
  add_config_flag(*cmd);
  cmd->callback([opts, cmd]() {
    resolve_tensorboard_flag(*cmd, *opts);
    opts->command = "train";
    opts->command_flags = command_flags(*cmd);
    opts->validate();
    RunSetup setup;
    setup.resolve_options = resolve_auto_strategy;
    TrainSummary summary = run_training(*opts, setup);
    // Every rank generates (the strategy's gathers are collectives); rank 0 prints, as
    // it prints the summary.
    if (summary.is_root && !summary.sample.empty()) {
      std::printf("\n--- sample ---\n%s\n--------------\n\n", summary.sample.c_str());
    }
    print_summary(summary);
    exit_if_stopped(summary);
  });
}

void add_run_shape_flags(CLI::App& cmd_ref, TrainOptions& opts_ref) {
  CLI::App* cmd = &cmd_ref;
  TrainOptions* opts = &opts_ref;
  std::string presets;
  for (const auto& n : model_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  cmd->add_option("--model", opts->model,
                  "Model preset (" + presets + "), or a Hugging Face model directory or "
                  "config.json; default: the --init-from directory's model, else " +
                      std::string(kDefaultModelPreset));
  cmd->add_option("--n-layer", opts->n_layer, "Override the preset's number of layers");
  cmd->add_option("--n-head", opts->n_head, "Override the preset's number of heads");
  cmd->add_option("--n-embd", opts->n_embd, "Override the preset's width");
  cmd->add_option("--vocab-size", opts->vocab_size,
                  "Override the vocabulary size (default: the data's)");
  cmd->add_option("--lora-rank", opts->lora_rank,
                  "LoRA: train rank-r adapters on a frozen base instead of every weight (0: off)")
      ->capture_default_str();
  cmd->add_option("--lora-alpha", opts->lora_alpha, "LoRA: adapter scale alpha (applied as alpha/r)")
      ->capture_default_str();
  cmd->add_option("--lora-targets", opts->lora_targets,
                  "LoRA: all-linear, or module names separated by commas (q_proj,k_proj,v_proj,"
                  "o_proj,gate_proj,up_proj,down_proj)")
      ->capture_default_str();
  cmd->add_option("--quantize-base", opts->quantize_base,
                  "LoRA: store the frozen base's linear weights as none or nf4 (QLoRA: 4-bit "
                  "NormalFloat, 64-value blocks with fp32 absmax, dequantized per layer)")
      ->capture_default_str();
  cmd->add_option("--context-len", opts->context_len,
                  "Override the preset's context length (positions; GPT-2: rows of the "
                  "position table, n_positions)");
  cmd->add_option("--micro-batch", opts->micro_batch, "Sequences per forward/backward")
      ->capture_default_str();
  cmd->add_option("--seq-len", opts->seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--global-batch", opts->global_batch,
                  "Sequences per optimizer step (gradient accumulation when larger than "
                  "micro-batch x world size; default: micro-batch x world size)");
  cmd->add_option("--grad-accum", opts->grad_accum,
                  "Micro-batches per rank per step: sets the global batch to micro-batch x world "
                  "size x this (instead of --global-batch)");
  cmd->add_option("--strategy", opts->strategy,
                  "ddp, zero1, zero2 (shard_grad_op), zero3 (fsdp, full_shard), hybrid, or (train, "
                  "plan) auto: the strategy `shardlm plan` recommends for this job")
      ->capture_default_str();
  cmd->add_option("--bucket-mb", opts->bucket_mb, "ddp/zero1 gradient bucket size in MiB")
      ->capture_default_str();
  cmd->add_option("--prefetch", opts->prefetch, "zero3/hybrid: units gathered ahead")
      ->capture_default_str();
  cmd->add_option("--reshard-after-forward", opts->reshard_after_forward,
                  "zero3/hybrid: free gathered params after forward (true/false)")
      ->capture_default_str();
  cmd->add_option("--shard-group-size", opts->shard_group_size,
                  "hybrid: ranks per shard group (parameters sharded inside, replicated across)");
  cmd->add_option("--mesh", opts->mesh,
                  "Layout of the ranks, outermost first, e.g. replicate=2,shard=4 (hybrid: "
                  "--shard-group-size 4 at 8 ranks), shard=2,expert=4 (--expert-parallel 4 at 8 "
                  "ranks); ddp and zero* run on shard=N");
  cmd->add_option("--tensor-parallel", opts->tensor_parallel,
                  "Split every transformer block over this many ranks (Megatron's tensor "
                  "parallelism; llama, qwen2, qwen3; the mesh's innermost dimension)")
      ->capture_default_str();
  cmd->add_flag("--sequence-parallel", opts->sequence_parallel,
               "With --tensor-parallel T: the residual stream, norms and residual adds hold "
               "1/T of the tokens per rank (Megatron's sequence parallelism)");
  cmd->add_option("--context-parallel", opts->context_parallel,
                  "Split every sequence over this many ranks (a context group: same rows, T/P "
                  "tokens each; world = replicas x shards x P); --mesh context=P says the same")
      ->capture_default_str();
  cmd->add_option("--context-parallel-kind", opts->context_parallel_kind,
                  "How the context group's attention sees whole rows: ulysses (all-to-all to "
                  "heads; the query and key/value heads must split over P or P be a multiple of "
                  "the key/value heads) or ring (zigzag split, key/value blocks passed around "
                  "the ranks; --seq-len a multiple of 2P) or hybrid (Ulysses inside groups of "
                  "--ulysses-degree consecutive ranks, ring across the groups)")
      ->capture_default_str();
  cmd->add_option("--ulysses-degree", opts->ulysses_degree,
                  "With --context-parallel-kind hybrid: the ranks of each Ulysses group (U "
                  "divides P and the heads; the ring runs over P / U groups)")
      ->capture_default_str();
  cmd->add_option("--expert-parallel", opts->expert_parallel,
                  "Mixture of experts: spread each layer's experts over this many ranks (an "
                  "expert mesh dimension carved out of data parallelism; tokens move by "
                  "all-to-all)")
      ->capture_default_str();
  cmd->add_option("--min-unit-params", opts->min_unit_params,
                  "Model units with fewer parameters are merged with a neighbour into one flat "
                  "unit (fewer, larger messages)")
      ->capture_default_str();
  cmd->add_option("--precision", opts->precision,
                  "Compute type: fp32, bf16 or fp16 (GEMM inputs and the activations that feed "
                  "them; master weights, AdamW state and gradients stay fp32; fp16 uses dynamic "
                  "loss scaling)")
      ->capture_default_str();
  cmd->add_option("--reduce-dtype", opts->reduce_dtype,
                  "Type gradients travel in when reduced across ranks: fp32, or bf16 (half the "
                  "bytes; contributions rounded to bf16, summed in fp32)")
      ->capture_default_str();
  cmd->add_option("--device", opts->device,
                  "Where each rank computes: cpu, cuda (one GPU per rank, the node-local rank's; "
                  "collectives over NCCL) or emulated (a test device: CPU kernels on memory the "
                  "host cannot read, for checking the device path without a GPU)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--offload", [opts](const std::string& text) { opts->offload = parse_offload(text); },
         "none, or optimizer: keep the owned fp32 master weights, the gradient's "
         "accumulation and AdamW state in host memory and run AdamW on the CPU; the "
         "device keeps the parameters in the compute type (device runs; ZeRO-Offload)")
      ->default_str("none");
  cmd->add_flag("--activation-checkpointing", opts->activation_checkpointing,
                "Keep only each block's input and recompute the block's forward in backward "
                "(activation memory of ~1 block instead of all; same gradients)");
}

void add_run_flags(CLI::App& cmd_ref, TrainOptions& opts_ref) {
  CLI::App* cmd = &cmd_ref;
  TrainOptions* opts = &opts_ref;
  cmd->add_option("--steps", opts->steps,
                  "Optimizer steps (0: only initialise/import and save a step-0 checkpoint)")
      ->capture_default_str();
  cmd->add_option("--epochs", opts->epochs,
                  "Passes over the training data instead of --steps (steps = rows / global batch, "
                  "rounded up)")
      ->excludes("--steps");
  cmd->add_flag("--packing", opts->packing,
                "Chat data: pack whole examples into each --seq-len row (attention and positions "
                "restart per example) instead of one padded example per row");
  cmd->add_option("--lr", opts->lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", opts->min_lr, "Final learning rate of the cosine (default lr/10)");
  cmd->add_option("--warmup", opts->warmup, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", opts->weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  cmd->add_option("--grad-clip", opts->grad_clip, "Global gradient-norm clip (0: off)")
      ->capture_default_str();
  cmd->add_option("--beta1", opts->beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", opts->beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed of init and data order")->capture_default_str();
  cmd->add_option("--eval-every", opts->eval_every, "Validation every N steps (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", opts->eval_batches, "Micro-batches per validation")
      ->capture_default_str();
  cmd->add_option("--save-every", opts->save_every, "Checkpoint every N steps (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--save-every-minutes", opts->save_every_minutes,
                  "Also a checkpoint when this many minutes passed since the last one (rank 0's "
                  "clock; 0: off). SIGTERM/SIGINT save and stop at the next step whatever this is")
      ->capture_default_str();
  cmd->add_option("--keep", opts->keep, "Checkpoints to keep (0: all)")->capture_default_str();
  cmd->add_flag("--resume", opts->resume,
                "Continue from the run directory's newest valid checkpoint (an error when it "
                "has none)");
  cmd->add_flag("--resume-if-exists", opts->resume_if_exists,
                "Continue from the newest valid checkpoint if the run directory has one, else "
                "start at step 0 (for job scripts that restart blindly; launch uses it)");
  cmd->add_option("--init-from", opts->init_from,
                  "Start from Hugging Face weights (a gpt2/llama/qwen2/qwen3 model directory with "
                  "config.json and model.safetensors or a sharded index, or a .safetensors file) "
                  "instead of random init");
  cmd->add_option("--memory-per-rank", opts->memory_per_rank_gib,
                  "--strategy auto: GiB each rank may use (default: the least, over the job's "
                  "hosts, of a host's available memory shared among its ranks)");
  cmd->add_option("--comm-timeout", opts->comm_timeout,
                  "Seconds any wait on a collective may take before the job is aborted")
      ->capture_default_str();
  cmd->add_flag("--check-replicas", opts->check_replicas,
                "Debug: verify after every step that replicated parameters agree across the "
                "ranks that hold them (with --tensor-parallel: ranks of the same tensor coordinate)");
  cmd->add_option("--loss-scale", opts->loss_scale, "fp16: initial dynamic loss scale")
      ->capture_default_str();
  cmd->add_option("--loss-scale-growth-interval", opts->loss_scale_growth_interval,
                  "fp16: steps without overflow before the loss scale doubles")
      ->capture_default_str();
  cmd->add_option("--threads", opts->threads,
                  "Compute threads per rank, >= 1 (default: the cores this host's ranks may "
                  "use, shared out among them)");
  cmd->add_option("--log-every", opts->log_every,
                  "Progress line every N steps when stdout is not a terminal");
  cmd->add_option("--tensorboard", opts->tensorboard_dir,
                  "Also write TensorBoard event files of the step scalars (loss, val loss, lr, grad "
                  "norm, tokens/s, step ms, exposed comm, peak memory by category) into DIR; without a "
                  "value RUN/tb (rank 0; metrics.jsonl is written as always)")
      ->expected(0, 1);
  cmd->add_option("--sample-tokens", opts->sample_tokens,
                  "Print a generated sample of N tokens at the end")
      ->capture_default_str();
  cmd->add_option("--sample-prompt", opts->sample_prompt, "Prompt of the final sample");
}

void resolve_tensorboard_flag(const CLI::App& cmd, TrainOptions& opts) {
  if (cmd.count("--tensorboard") > 0 && opts.tensorboard_dir.empty())
    opts.tensorboard_dir = (std::filesystem::path(opts.out_dir) / "tb").string();
}

}  // namespace shardlm::cli
