// The plan-equivalence corpus (issue 24 item 1): configurations whose planned bytes
// per memory category (device and host) and bytes on the wire per step must stay
// what plan_run computed at commit 517860e, when it restated the strategy's schedule
// in closed form (it now runs the real step on the meta device):
// tests/fixtures/plan_corpus_517860e.txt, written by record_plan_corpus. Not the full product of the dimensions: a covering set in
// which every family meets every strategy, and precision, adapters (none, LoRA,
// QLoRA), activation checkpointing, the device (cpu, emulated, emulated with the
// optimizer offloaded), gradient accumulation, bf16 reduction and the world sizes
// 1, 2, 3, 8 and 1024 rotate through them.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "shardlm/model/config.hpp"
#include "shardlm/plan/run_plan.hpp"

namespace shardlm::plan_corpus {

struct Case {
  std::string name;
  RunPlanRequest request;
};

inline std::vector<Case> cases() {
  // Tiny presets (small units: --min-unit-params merges them) and real shapes.
  const char* families[4][2] = {{"gpt2-tiny", "gpt2"},
                                {"llama-tiny", "llama-3.2-1b"},
                                {"qwen2-tiny", "qwen2.5-0.5b"},
                                {"qwen3-tiny", "qwen3-0.6b"}};
  const StrategyKind kinds[] = {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                                StrategyKind::zero3, StrategyKind::hybrid};
  const DType precisions[] = {DType::fp32, DType::bf16, DType::fp16};
  const int worlds[] = {1, 2, 3, 8, 1024};
  std::vector<Case> out;
  int t = 0;
  for (int f = 0; f < 4; ++f)
    for (int s = 0; s < 5; ++s)
      for (int v = 0; v < 4; ++v, ++t) {
        const bool llama_family = f > 0;
        const std::string preset = families[f][v % 2];
        RunPlanRequest r;
        r.config = model_preset(preset);
        const int n = worlds[(t + v) % 5];
        r.world_size = n;
        const DType precision = precisions[(t / 2 + v) % 3];
        r.strategy.kind = kinds[s];
        r.strategy.param_dtype = precision;
        r.model.precision = precision;
        r.model.activation_checkpointing = (t / 3) % 2 == 1;
        // Adapters: none, LoRA, QLoRA (the Llama families only; GPT-2 has none).
        const int adapters = llama_family ? (t + s) % 3 : 0;
        if (adapters > 0) {
          r.config.lora.rank = 8;
          r.config.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
          if (adapters == 2) r.config.quantize_base = BaseQuant::nf4;
        }
        // Device: cpu, emulated, emulated with the optimizer offloaded to the host.
        const int device = (t + f) % 3;
        if (device > 0) r.model.device = Device{DeviceKind::emulated, 0};
        r.strategy.optimizer_on_host = device == 2;
        if (t % 4 == 1) r.strategy.reduce_dtype = DType::bf16;
        r.micro_batch = v % 2 == 0 ? 4 : 2;
        r.seq_len = v % 2 == 0 ? 64 : 128;
        // Gradient accumulation on every other configuration.
        r.global_batch = t % 2 == 0 ? 2 * r.micro_batch * n : 0;
        if (kinds[s] == StrategyKind::hybrid)
          r.strategy.shard_group_size = n == 8 ? 4 : n == 1024 ? 8 : n;
        if (kinds[s] == StrategyKind::zero3 || kinds[s] == StrategyKind::hybrid) {
          r.strategy.prefetch = v % 3;
          r.strategy.reshard_after_forward = v != 1;
        }
        if (t % 5 == 2) r.min_unit_params = 1;  // no merging: one flat unit per model unit
        const std::string name = fmt::format(
            "{:02d}-{}-{}-{}-n{}-{}{}{}{}", t, preset, to_string(kinds[s]), dtype_name(precision), n,
            adapters == 0 ? "full" : adapters == 1 ? "lora" : "qlora",
            r.model.activation_checkpointing ? "-ckpt" : "",
            device == 0 ? "-cpu" : device == 1 ? "-emulated" : "-emulated-offload",
            r.global_batch > 0 ? "-accum" : "");
        out.push_back({name, r});
      }
  // The planning case the issue times: llama-3.1-70b on 1024 ranks.
  for (StrategyKind kind : {StrategyKind::zero3, StrategyKind::hybrid}) {
    RunPlanRequest r;
    r.config = model_preset("llama-3.1-70b");
    r.world_size = 1024;
    r.strategy.kind = kind;
    r.strategy.param_dtype = DType::bf16;
    r.model.precision = DType::bf16;
    r.model.activation_checkpointing = true;
    r.model.device = Device{DeviceKind::emulated, 0};
    r.micro_batch = 1;
    r.seq_len = 4096;
    if (kind == StrategyKind::hybrid) r.strategy.shard_group_size = 8;
    out.push_back({fmt::format("{:02d}-llama-3.1-70b-{}-bf16-n1024-full-ckpt-emulated", t++,
                               to_string(kind)),
                   r});
  }
  return out;
}

// The figures compared, one line per case: "name key=value ...", integers as they
// are, the wire bytes as %.17g (exact for a double).
inline std::string figures_line(const std::string& name, const RunPlan& p) {
  return fmt::format(
      "{} partition={} accumulation={} parameters={} params={} grads={} optimizer={} "
      "activations={} comm={} frozen={} host_params={} host_grads={} host_optimizer={} "
      "host_frozen={} host_comm={} wire_bytes={:.17g}",
      name, p.partition, p.accumulation, p.parameters, p.params, p.grads, p.optimizer,
      p.activations, p.comm, p.frozen, p.host.params, p.host.grads, p.host.optimizer,
      p.host.frozen, p.host.comm, p.wire_bytes_per_step);
}

}  // namespace shardlm::plan_corpus
