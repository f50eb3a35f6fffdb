#!/usr/bin/env python3
"""A mixture of experts against its dense counterpart, shardlm against PyPI PyTorch +
transformers (issue 26's speed figure), in one run on this machine.

The two models (Hugging Face config.json files written here, so that both sides train
exactly the same architecture; random init, the byte-level tinyshakespeare batch):
  moe    Qwen3-MoE, 4 layers x 256, 8:4 GQA, head_dim 32, 8 experts of width 256,
         top-2 (norm_topk_prob), load-balancing loss on (coefficient 0.001)
  dense  Qwen3 of the same shape with one MLP of width 512 = top-k x expert width:
         the MoE's active parameters but for its router (8 x 256 per layer)
For each model and precision: shardlm (`shardlm train --model DIR`, E = 1) and
transformers' own model under PyPI PyTorch (tools/pytorch_llama_ref.py, bench/
families_vs_pytorch.py's runner); for the MoE every experts implementation transformers
5 has (eager: a loop over experts, batched_mm, grouped_mm) and the fastest is the one
compared. Then the GEMM library alone on the shardlm step's own GEMM calls
(bench/step_gemm_rate --model DIR: every expert GEMM with its real token count) and
shardlm's step by phase.

usage: bench/moe_vs_pytorch.py [--dtypes fp32,bf16] [--batch 4] [--seq 256] [--steps 6]
          [--warmup 2] [--threads 2] [--python /work/venv/bin/python] [--shardlm build/shardlm]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_vs_pytorch as fam  # noqa: E402

COMMON = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
              head_dim=32, vocab_size=512, max_position_embeddings=1024, rms_norm_eps=1e-6,
              tie_word_embeddings=False, hidden_act="silu", rope_theta=1000000.0,
              attention_bias=False, use_sliding_window=False, attention_dropout=0.0,
              initializer_range=0.02)
MODELS = {
    "moe": dict(COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=256, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[], output_router_logits=True, router_aux_loss_coef=0.001),
    "dense": dict(COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                  intermediate_size=512),
}
EXPERTS = ["eager", "batched_mm", "grouped_mm"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--python", default="/work/venv/bin/python")
    ap.add_argument("--shardlm", default=os.path.join(fam.ROOT, "build", "shardlm"))
    ap.add_argument("--step-gemm-rate", default=os.path.join(fam.ROOT, "build", "bench", "step_gemm_rate"))
    args = ap.parse_args()
    args.lora_rank = 0
    work = tempfile.mkdtemp(prefix="shardlm-moe-bench-")
    try:
        data = os.path.join(work, "data")
        fam.run([args.shardlm, "prepare", "--tokenizer", "byte", "--input",
                 os.path.join(fam.SHARED, "tinyshakespeare.txt"), "--out", data], "prepare")
        rows = {}
        for name, hf in MODELS.items():
            model_dir = os.path.join(work, name)
            os.makedirs(model_dir)
            config_json = os.path.join(model_dir, "config.json")
            json.dump(hf, open(config_json, "w"), indent=1)
            fam.CONFIGS[name] = (model_dir, args.batch, args.seq)
            for dtype in args.dtypes.split(","):
                print(f"== {name} {dtype}", file=sys.stderr, flush=True)
                torch_runs = {}
                for impl in (EXPERTS if name == "moe" else ["-"]):
                    extra = ["--experts-implementation", impl] if impl != "-" else []
                    torch_runs[impl] = fam.run_pytorch(args.python, config_json, data, name, dtype,
                                                       False, args, extra)
                ours = fam.run_shardlm(args.shardlm, data, work, name, dtype, args)
                rate = json.loads(fam.run([args.step_gemm_rate, "--model", model_dir, "--batch",
                                           str(args.batch), "--seq", str(args.seq), "--precision",
                                           dtype, "--threads", str(args.threads)],
                                          "step_gemm_rate").stdout.strip().splitlines()[-1])
                rows[(name, dtype)] = (ours, torch_runs, rate)
        print_tables(rows, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_tables(rows, args):
    tokens = args.batch * args.seq
    print(f"\nB={args.batch} T={args.seq} ({tokens} tokens/step), {args.threads} threads, "
          f"median of {args.steps - args.warmup} steps after {args.warmup} warm-up\n")
    print("| model | dtype | shardlm tok/s | PyTorch tok/s (experts implementation) | best PyTorch | "
          "shardlm vs best | shardlm peak RSS MiB | best PyTorch peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, dtype), (ours, torch_runs, _) in rows.items():
        best_impl, best = max(torch_runs.items(), key=lambda kv: kv[1]["tokens_per_s"])
        each = ", ".join(f"{r['tokens_per_s']:.0f} ({k})" for k, r in torch_runs.items())
        print(f"| {name} | {dtype} | {ours['tokens_per_s']:.0f} | {each} | {best_impl} | "
              f"{ours['tokens_per_s'] / best['tokens_per_s']:.2f}x | {ours['peak_rss_mib']:.0f} | "
              f"{best['peak_rss_mib']:.0f} |")
    print("\nMoE against its dense counterpart (tokens/s ratio, same side):\n")
    print("| dtype | shardlm moe/dense | best PyTorch moe/dense |")
    print("|---|---|---|")
    for dtype in args.dtypes.split(","):
        if ("moe", dtype) not in rows or ("dense", dtype) not in rows:
            continue
        m, d = rows[("moe", dtype)], rows[("dense", dtype)]
        best = lambda r: max(x["tokens_per_s"] for x in r[1].values())
        print(f"| {dtype} | {m[0]['tokens_per_s'] / d[0]['tokens_per_s']:.2f} | {best(m) / best(d):.2f} |")
    print("\nshardlm peak memory by category (MiB, MemoryTracker):\n")
    cats = ["params", "frozen", "grads", "optimizer", "activations", "comm", "other"]
    print("| model | dtype | " + " | ".join(cats) + " |")
    print("|---|---|" + "---|" * len(cats))
    for (name, dtype), (ours, _, _) in rows.items():
        print(f"| {name} | {dtype} | " + " | ".join(f"{ours['memory'].get(c, 0) / 2**20:.1f}" for c in cats) + " |")
    print("\nGEMM fraction: the shardlm step's model GFLOP/s against the GEMM library alone on the "
          "step's own GEMM calls (bench/step_gemm_rate), and the step's GEMM phase against the "
          "library's time for the same calls:\n")
    print("| model | dtype | model GFLOP/step | step ms | achieved GFLOP/s | library GFLOP/s | fraction "
          "| GEMM phase ms | library GEMM ms | GEMM-phase rate / library | library |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, dtype), (ours, _, rate) in rows.items():
        achieved = rate["model_flops"] / ours["median_step_ms"] * 1e-6
        gemm_ms = ours["phase_ms"].get("gemm", float("nan"))
        lib_ms = rate["step_gemm_seconds"] * 1e3
        print(f"| {name} | {dtype} | {rate['model_flops'] * 1e-9:.2f} | {ours['median_step_ms']:.0f} | "
              f"{achieved:.1f} | {rate['gemm_gflops']:.1f} | {achieved / rate['gemm_gflops']:.2f} | "
              f"{gemm_ms:.0f} | {lib_ms:.0f} | {lib_ms / gemm_ms:.2f} | {rate['library']} |")
    print("\nshardlm step by phase (median step, ms):\n")
    phases = sorted({p for (ours, _, _) in rows.values() for p in ours["phase_ms"]})
    print("| model | dtype | " + " | ".join(phases) + " |")
    print("|---|---|" + "---|" * len(phases))
    for (name, dtype), (ours, _, _) in rows.items():
        print(f"| {name} | {dtype} | " + " | ".join(f"{ours['phase_ms'].get(p, 0):.0f}" for p in phases) + " |")
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
