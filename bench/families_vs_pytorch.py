#!/usr/bin/env python3
"""shardlm against PyPI PyTorch + transformers on Llama-family models, in one run
(issue 13's benchmark).

For each config and precision it trains the same model shape on the same batch with
  - PyTorch 2.x from PyPI running transformers' own model of that config
    (tools/pytorch_llama_ref.py: sdpa attention, bf16 autocast for bf16, AdamW + clipping),
    eager and, with --compile, torch.compile'd;
  - shardlm (`shardlm train`, random init, same batch and optimizer settings),
back to back so they see the same load; --rounds R repeats that and reports medians.
The PyTorch model's config.json is the one `shardlm export` writes for the preset, so
both train exactly the same architecture. Then it times the GEMM library alone on the
shardlm step's own GEMM calls (bench/step_gemm_rate) and prints tokens/s, peak RSS,
shardlm's memory by category, and the step's model GFLOP/s as a fraction of the
library's rate.

  smollm2  smollm2-135m (Llama, 30 x 576, 9:3 GQA), B=4, T=512
  qwen05   qwen2.5-0.5b (Qwen2, 24 x 896, 14:2 GQA, qkv bias, vocab 151936), B=1, T=1024

With --lora-rank R both sides train LoRA adapters (r=R, alpha 16, all linear layers of
the decoder) on the frozen model instead: shardlm's --lora-rank against PyPI peft's
get_peft_model (issue 14's step-time comparison).

usage: bench/families_vs_pytorch.py [--configs smollm2,qwen05] [--dtypes fp32,bf16]
          [--steps 6] [--warmup 2] [--rounds 1] [--threads 2] [--compile] [--lora-rank R]
          [--python /work/venv/bin/python] [--shardlm build/shardlm]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
CONFIGS = {"smollm2": ("smollm2-135m", 4, 512), "qwen05": ("qwen2.5-0.5b", 1, 1024)}
# Runs one command in a child Python so that ru_maxrss is that command's alone.
MEASURE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
OPTIMIZER = ["--lr", "6e-4", "--weight-decay", "0.1", "--beta1", "0.9", "--beta2", "0.95",
             "--grad-clip", "1.0"]


def run(cmd, what):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{what} failed: {' '.join(cmd)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result


def hf_config_of(shardlm, preset, data, work):
    """config.json of the preset as `shardlm export` writes it (a step-0 export)."""
    run_dir, out = os.path.join(work, f"init_{preset}"), os.path.join(work, f"hf_{preset}")
    for d in (run_dir, out):
        shutil.rmtree(d, ignore_errors=True)
    run([shardlm, "train", "--model", preset, "--data", data, "--out", run_dir, "--steps", "0",
         "--seq-len", "8", "--micro-batch", "1", "--eval-batches", "0"], "shardlm init")
    run([shardlm, "export", "--checkpoint", run_dir, "--out", out, "--dtype", "bf16"], "export")
    config = os.path.join(work, f"{preset}.config.json")
    shutil.copy(os.path.join(out, "config.json"), config)
    shutil.rmtree(out)
    shutil.rmtree(run_dir)
    return config


def run_pytorch(python, config_json, data, name, dtype, compiled, args, extra=()):
    _, batch, seq = CONFIGS[name]
    cmd = [python, os.path.join(ROOT, "tools", "pytorch_llama_ref.py"), "--config", config_json,
           "--tokens", os.path.join(data, "train.bin"), "--batch", str(batch), "--seq-len",
           str(seq), "--dtype", dtype, "--threads", str(args.threads), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--lora-rank", str(args.lora_rank)] + (
               ["--compile"] if compiled else []) + list(extra)
    result = run([sys.executable, "-c", MEASURE] + cmd, "PyTorch")
    lines = result.stdout.strip().splitlines()
    out = json.loads(lines[-2])
    out["peak_rss_mib"] = int(lines[-1]) / 1024
    return out


def run_shardlm(shardlm, data, work, name, dtype, args, ranks=1, extra=()):
    """One shardlm training run; ranks > 1 runs `ranks` processes under mpirun, each with
    batch / ranks rows of the same global batch and threads / ranks threads."""
    preset, batch, seq = CONFIGS[name]
    out = os.path.join(work, f"shardlm_{name}_{dtype}")
    shutil.rmtree(out, ignore_errors=True)
    launcher = [] if ranks == 1 else ["mpirun", "--oversubscribe", "-n", str(ranks)]
    cmd = launcher + [shardlm, "train", "--model", preset, "--data", data, "--out", out, "--steps",
           str(args.steps), "--micro-batch", str(batch // ranks), "--global-batch", str(batch),
           "--seq-len", str(seq), "--eval-batches", "0", "--threads",
           str(max(1, args.threads // ranks)), "--precision", dtype, "--log-every",
           str(args.steps), "--save-every", "0", "--keep", "1"] + OPTIMIZER + (
               ["--lora-rank", str(args.lora_rank), "--lora-alpha", "16"] if args.lora_rank > 0 else []) + list(extra)
    result = run([sys.executable, "-c", MEASURE] + cmd, "shardlm")
    peak_rss_mib = int(result.stdout.strip().splitlines()[-1]) / 1024
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    timed = records[args.warmup:]
    median_ms = statistics.median(r["step_ms"] for r in timed)
    median_step = sorted(timed, key=lambda r: r["step_ms"])[len(timed) // 2]
    shutil.rmtree(os.path.join(out, "checkpoints"), ignore_errors=True)
    return {"tokens_per_s": batch * seq / median_ms * 1e3, "median_step_ms": median_ms,
            "peak_rss_mib": peak_rss_mib, "memory": records[-1]["mem"]["peak"],
            "phase_ms": median_step.get("phase_ms", {})}


def median_of(results):
    return sorted(results, key=lambda r: r["tokens_per_s"])[len(results) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="smollm2,qwen05")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile'd PyTorch")
    ap.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters on both sides (0: full)")
    ap.add_argument("--python", default="/work/venv/bin/python")
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--step-gemm-rate", default=os.path.join(ROOT, "build", "bench", "step_gemm_rate"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shardlm-families-bench-")
    try:
        data = os.path.join(work, "data")
        run([args.shardlm, "prepare", "--tokenizer", "byte", "--input",
             os.path.join(SHARED, "tinyshakespeare.txt"), "--out", data], "prepare")
        rows = {}
        for name in args.configs.split(","):
            preset = CONFIGS[name][0]
            config_json = hf_config_of(args.shardlm, preset, data, work)
            for dtype in args.dtypes.split(","):
                results = {"eager": [], "compiled": [], "shardlm": []}
                for r in range(args.rounds):
                    print(f"== {name} {dtype} round {r + 1}", file=sys.stderr, flush=True)
                    results["eager"].append(run_pytorch(args.python, config_json, data, name, dtype, False, args))
                    if args.compile:
                        results["compiled"].append(run_pytorch(args.python, config_json, data, name, dtype, True, args))
                    results["shardlm"].append(run_shardlm(args.shardlm, data, work, name, dtype, args))
                _, batch, seq = CONFIGS[name]
                rate = json.loads(run([args.step_gemm_rate, "--model", preset, "--batch", str(batch),
                                       "--seq", str(seq), "--precision", dtype, "--threads",
                                       str(args.threads)], "step_gemm_rate").stdout.strip().splitlines()[-1])
                rows[(name, dtype)] = ({k: median_of(v) for k, v in results.items() if v}, rate)
        print_tables(rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_tables(rows):
    print("\n| config | dtype | shardlm tok/s | PyTorch eager tok/s | PyTorch compiled tok/s | "
          "vs best PyTorch | shardlm peak RSS MiB | PyTorch peak RSS MiB (best run) | RSS ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, dtype), (res, _) in rows.items():
        ours = res["shardlm"]
        refs = [res[k] for k in ("eager", "compiled") if k in res]
        best = max(refs, key=lambda r: r["tokens_per_s"])
        compiled = f"{res['compiled']['tokens_per_s']:.0f}" if "compiled" in res else "-"
        print(f"| {name} | {dtype} | {ours['tokens_per_s']:.0f} | {res['eager']['tokens_per_s']:.0f} | "
              f"{compiled} | {ours['tokens_per_s'] / best['tokens_per_s']:.2f}x | "
              f"{ours['peak_rss_mib']:.0f} | {best['peak_rss_mib']:.0f} | "
              f"{ours['peak_rss_mib'] / best['peak_rss_mib']:.2f} |")
    print("\nshardlm peak memory by category (MiB, MemoryTracker):\n")
    cats = ["params", "frozen", "grads", "optimizer", "activations", "comm", "other"]
    print("| config | dtype | " + " | ".join(cats) + " |")
    print("|---|---|" + "---|" * len(cats))
    for (name, dtype), (res, _) in rows.items():
        mem = res["shardlm"]["memory"]
        print(f"| {name} | {dtype} | " + " | ".join(f"{mem.get(c, 0) / 2**20:.0f}" for c in cats) + " |")
    print("\nGEMM fraction: model GFLOP/s of the shardlm step against the GEMM library alone on "
          "the step's own GEMM calls (bench/step_gemm_rate; target >= 0.85):\n")
    print("| config | dtype | model GFLOP/step | median step ms | achieved GFLOP/s | library GFLOP/s "
          "| fraction | cold library GFLOP/s | cold fraction | GEMM ms (phase) | library |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, dtype), (res, rate) in rows.items():
        ours = res["shardlm"]
        achieved = rate["model_flops"] / ours["median_step_ms"] * 1e-6
        print(f"| {name} | {dtype} | {rate['model_flops'] * 1e-9:.0f} | {ours['median_step_ms']:.0f} | "
              f"{achieved:.1f} | {rate['gemm_gflops']:.1f} | {achieved / rate['gemm_gflops']:.2f} | "
              f"{rate['cold_gemm_gflops']:.1f} | {achieved / rate['cold_gemm_gflops']:.2f} | "
              f"{ours['phase_ms'].get('gemm', float('nan')):.0f} | {rate['library']} |")
    print("\nshardlm step breakdown (median step, ms):\n")
    phases = ["gemm", "attention", "norms_elementwise", "loss", "optimizer", "communication", "other"]
    print("| config | dtype | " + " | ".join(phases) + " |")
    print("|---|---|" + "---|" * len(phases))
    for (name, dtype), (res, _) in rows.items():
        ph = res["shardlm"]["phase_ms"]
        print(f"| {name} | {dtype} | " + " | ".join(f"{ph.get(p, 0):.0f}" for p in phases) + " |")


if __name__ == "__main__":
    main()
