#!/usr/bin/env python3
"""shardlm against PyTorch on this machine, in one run (issue 7's benchmark).

Trains the same GPT-2 shapes with shardlm (default environment, nothing tuned) and
with the PyTorch reference (tools/pytorch_gpt2_ref.py through bench/pytorch_ref.sh,
PyTorch run "default" and "tuned"), then prints tokens/s, peak RSS and the ratios.

Each config and dtype runs PyTorch default, PyTorch tuned and shardlm back to back, so
the three see the same load; --rounds R repeats that and reports medians. Right after
the last round's shardlm training it times the GEMM library alone on exactly the GEMM
calls of that step (bench/step_gemm_rate, same precision and threads) and prints the
step's achieved model GFLOP/s as a fraction of the library's rate, and the median
step's breakdown by phase (metrics.jsonl "phase_ms"; docs/profiling.md).

  small  gpt2-small-30m: 6 layers x 384, vocab 50304, B=8, T=256
  124m   gpt2 124M: 12 layers x 768, B=1, T=1024

usage: bench/speed_vs_pytorch.py [--configs small,124m] [--dtypes fp32,bf16]
                                 [--steps 10] [--warmup 2] [--threads 2] [--rounds 1]
                                 [--shardlm build/shardlm] [--step-gemm-rate PATH]
                                 [--gemm-quiet-wait 2]
Standard library only; PyTorch comes from Debian's python3-torch (bench/pytorch_ref.sh
installs the tuned environment's packages if missing).
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
CONFIGS = {"small": ("gpt2-small-30m", 8, 256), "124m": ("gpt2", 1, 1024)}

# Runs one command in a child Python so that ru_maxrss is that command's alone.
MEASURE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")


def run_shardlm(shardlm, data, work, config, dtype, args):
    preset, batch, seq = CONFIGS[config]
    out = os.path.join(work, f"shardlm_{config}_{dtype}")
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each round, not a resume
    cmd = [shardlm, "train", "--model", preset, "--data", data, "--out", out, "--steps",
           str(args.steps), "--micro-batch", str(batch), "--seq-len", str(seq), "--eval-batches",
           "0", "--threads", str(args.threads), "--precision", dtype, "--log-every",
           str(args.steps)]
    result = subprocess.run([sys.executable, "-c", MEASURE] + cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"shardlm failed: {' '.join(cmd)}\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    peak_rss_mib = int(result.stdout.strip().splitlines()[-1]) / 1024
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    timed = records[args.warmup:]
    median_ms = statistics.median(r["step_ms"] for r in timed)
    # The breakdown comes from one real step: the median one (the upper median when
    # the count is even), so its phases add up to its own step time.
    median_step = sorted(timed, key=lambda r: r["step_ms"])[len(timed) // 2]
    return {"tokens_per_s": batch * seq / median_ms * 1e3, "median_step_ms": median_ms,
            "peak_rss_mib": peak_rss_mib, "median_step": median_step}


def run_step_gemm_rate(binary, config, dtype, args):
    """The GEMM library alone on the step's own GEMM calls: one JSON object."""
    preset, batch, seq = CONFIGS[config]
    # The machine is shared: each shape's timing waits (a little) for a quiet moment,
    # so the library's rate is its own, not that of whatever else runs.
    cmd = [binary, "--model", preset, "--batch", str(batch), "--seq", str(seq), "--precision",
           dtype, "--threads", str(args.threads), "--quiet-wait", str(args.gemm_quiet_wait)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"step_gemm_rate failed: {' '.join(cmd)}\n{result.stdout[-2000:]}"
                 f"{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def median_run(results):
    """The run with the median tokens/s (the upper median for an even count), whole, so
    its step time, RSS and breakdown stay one run's own."""
    return sorted(results, key=lambda r: r["tokens_per_s"])[len(results) // 2]


PHASES = ["gemm", "attention", "norms_elementwise", "loss", "optimizer", "communication", "other"]


def print_efficiency(runs):
    """Model GFLOP/s of the shardlm step against the library on the step's GEMMs."""
    print("\nModel FLOPs per step = the step's GEMM FLOPs (2 M N K summed over every linear-layer "
          "and LM-head GEMM call of forward and backward, LM head over the real vocabulary) + "
          "causal attention matmul FLOPs (6 C T (T+1) per layer and sequence: QK^T, PV forward; "
          "dP, dV, dQ, dK backward; visible pairs only). Achieved = model FLOPs / median step "
          "time. Library = FLOP-weighted GFLOP/s of the GEMM library alone on exactly the "
          "step's GEMM calls (bench/step_gemm_rate, same precision and threads, best of 3 "
          "passes, each shape waiting up to --gemm-quiet-wait s for a quiet machine); its "
          "operands stay in the caches between timed runs. Cold = the same with the caches "
          "flushed before every timed run, as a step's GEMMs mostly find them. "
          "Fraction = achieved / library (target >= 0.85); cold fraction = achieved / cold.\n")
    print("| config | dtype | model GFLOP/step | median step ms | achieved GFLOP/s | library "
          "GFLOP/s on step GEMMs | fraction | cold library GFLOP/s | cold fraction | "
          "step GEMM ms (phase) | same GEMMs alone ms | alone, cold ms | GEMM library | "
          "LM head chunk rows | shapes timed quiet |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (config, dtype), (ours, rate) in runs.items():
        achieved = rate["model_flops"] / ours["median_step_ms"] * 1e-6
        gemm_ms = ours["median_step"].get("phase_ms", {}).get("gemm", float("nan"))
        print(f"| {config} | {dtype} | {rate['model_flops'] * 1e-9:.1f} | "
              f"{ours['median_step_ms']:.0f} | {achieved:.1f} | {rate['gemm_gflops']:.1f} | "
              f"{achieved / rate['gemm_gflops']:.2f} | {rate['cold_gemm_gflops']:.1f} | "
              f"{achieved / rate['cold_gemm_gflops']:.2f} | {gemm_ms:.0f} | "
              f"{rate['step_gemm_seconds'] * 1e3:.0f} | "
              f"{rate['cold_step_gemm_seconds'] * 1e3:.0f} | {rate['library']} | "
              f"{rate['head_chunk_rows']} | "
              f"{sum(s['quiet'] for s in rate['shapes'])}/{len(rate['shapes'])} |")


def print_breakdown(runs):
    """The median step's phase_ms: exclusive wall time per phase, ms and % of the step."""
    labels = [f"{config} {dtype}" for config, dtype in runs]
    print("\nBreakdown of the median step (metrics.jsonl phase_ms: exclusive wall ms per "
          "phase; communication = exposed wait; other = step minus the rest)\n")
    print("| phase | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for phase in PHASES + ["step"]:
        cells = []
        for ours, _ in runs.values():
            step = ours["median_step"]
            ms = step["step_ms"] if phase == "step" else step.get("phase_ms", {}).get(phase)
            cells.append("-" if ms is None else f"{ms:.0f} ({ms / step['step_ms'] * 100:.0f}%)")
        print(f"| {phase} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="small,124m")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat every config's PyTorch default, tuned and shardlm runs this "
                         "many times and report medians")
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    ap.add_argument("--step-gemm-rate", default=None,
                    help="bench/step_gemm_rate binary (default: bench/ next to --shardlm)")
    ap.add_argument("--gemm-quiet-wait", type=float, default=2.0,
                    help="seconds step_gemm_rate waits for other processes to go idle per shape")
    args = ap.parse_args()
    rate_binary = args.step_gemm_rate or os.path.join(os.path.dirname(args.shardlm), "bench",
                                                       "step_gemm_rate")
    print(f"load average at start: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    with tempfile.TemporaryDirectory(prefix="shardlm-speed-") as work:
        data = os.path.join(work, "data")
        subprocess.run([args.shardlm, "prepare", "--tokenizer", f"gpt2:{SHARED}/gpt2", "--input",
                        f"{SHARED}/tinyshakespeare.txt", "--out", data], check=True,
                       capture_output=True)
        # Each config and dtype runs PyTorch default, PyTorch tuned and shardlm back to
        # back, so the three see the same machine load; with --rounds R > 1 the whole
        # sequence repeats and each figure is the median over the rounds (ratios of
        # medians), which damps this shared machine's swings.
        torch_file = os.path.join(work, "pytorch.jsonl")
        samples = {}
        runs = {}
        for round_index in range(args.rounds):
            for config in args.configs.split(","):
                for dtype in args.dtypes.split(","):
                    if os.path.exists(torch_file):
                        os.remove(torch_file)
                    subprocess.run(["bash", os.path.join(ROOT, "bench", "pytorch_ref.sh"),
                                    "--configs", config, "--dtypes", dtype, "--steps",
                                    str(args.steps), "--warmup", str(args.warmup), "--threads",
                                    str(args.threads), "--results", torch_file], check=True,
                                   stdout=subprocess.DEVNULL)
                    entry = samples.setdefault((config, dtype), {"ours": []})
                    for line in open(torch_file):
                        r = json.loads(line)
                        entry.setdefault(r["label"].split()[2], []).append(r)
                    ours = run_shardlm(args.shardlm, data, work, config, dtype, args)
                    entry["ours"].append(ours)
                    print(f"round {round_index + 1}/{args.rounds} {config} {dtype}: shardlm "
                          f"{ours['tokens_per_s']:.0f} tok/s, PyTorch default "
                          f"{entry['default'][-1]['tokens_per_s']:.0f}, tuned "
                          f"{entry['tuned'][-1]['tokens_per_s']:.0f}", flush=True)
                    if round_index == args.rounds - 1:
                        # The GEMM library alone, right after the last round's run.
                        runs[(config, dtype)] = (median_run(entry["ours"]),
                                                 run_step_gemm_rate(rate_binary, config, dtype,
                                                                    args))
        print(f"\n{args.rounds} round(s); each figure is the median over the rounds\n")
        print("| config | dtype | shardlm tok/s | PyTorch default | PyTorch tuned | vs default | "
              "vs tuned | shardlm RSS MiB | tuned RSS MiB | RSS ratio |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for (config, dtype), entry in samples.items():
            ours = median_run(entry["ours"])
            d = median_run(entry["default"])
            t = median_run(entry["tuned"])
            print(f"| {config} | {dtype} | {ours['tokens_per_s']:.0f} | {d['tokens_per_s']:.0f} | "
                  f"{t['tokens_per_s']:.0f} | {ours['tokens_per_s'] / d['tokens_per_s']:.2f}x | "
                  f"{ours['tokens_per_s'] / t['tokens_per_s']:.2f}x | {ours['peak_rss_mib']:.0f} | "
                  f"{t['peak_rss_mib']:.0f} | {ours['peak_rss_mib'] / t['peak_rss_mib']:.2f} |")
        print_efficiency(runs)
        print_breakdown(runs)
        print(f"\nload average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    main()
