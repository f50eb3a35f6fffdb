#!/usr/bin/env python3
"""shardlm against PyTorch on this machine, in one run (issue 7's benchmark).

Trains the same GPT-2 shapes with shardlm (default environment, nothing tuned) and
with the PyTorch reference (tools/pytorch_gpt2_ref.py through bench/pytorch_ref.sh,
PyTorch run "default" and "tuned"), then prints tokens/s, peak RSS and the ratios.

  small  gpt2-small-30m: 6 layers x 384, vocab 50304, B=8, T=256
  124m   gpt2 124M: 12 layers x 768, B=1, T=1024

usage: bench/speed_vs_pytorch.py [--configs small,124m] [--dtypes fp32,bf16]
                                 [--steps 10] [--warmup 2] [--threads 2]
Standard library only; PyTorch comes from Debian's python3-torch (bench/pytorch_ref.sh
installs the tuned environment's packages if missing).
"""
import argparse
import json
import os
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
    cmd = [shardlm, "train", "--model", preset, "--data", data, "--out", out, "--steps",
           str(args.steps), "--micro-batch", str(batch), "--seq-len", str(seq), "--eval-batches",
           "0", "--threads", str(args.threads), "--precision", dtype, "--log-every",
           str(args.steps)]
    result = subprocess.run([sys.executable, "-c", MEASURE] + cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"shardlm failed: {' '.join(cmd)}\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    peak_rss_mib = int(result.stdout.strip().splitlines()[-1]) / 1024
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    median_ms = statistics.median(r["step_ms"] for r in records[args.warmup:])
    return {"tokens_per_s": batch * seq / median_ms * 1e3, "median_step_ms": median_ms,
            "peak_rss_mib": peak_rss_mib}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="small,124m")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardlm-speed-") as work:
        data = os.path.join(work, "data")
        subprocess.run([args.shardlm, "prepare", "--tokenizer", f"gpt2:{SHARED}/gpt2", "--input",
                        f"{SHARED}/tinyshakespeare.txt", "--out", data], check=True,
                       capture_output=True)
        torch_file = os.path.join(work, "pytorch.jsonl")
        subprocess.run(["bash", os.path.join(ROOT, "bench", "pytorch_ref.sh"), "--configs",
                        args.configs, "--dtypes", args.dtypes, "--steps", str(args.steps),
                        "--warmup", str(args.warmup), "--threads", str(args.threads),
                        "--results", torch_file], check=True, stdout=subprocess.DEVNULL)
        torch = {}
        for line in open(torch_file):
            r = json.loads(line)
            config, dtype, env = r["label"].split()
            torch[(config, dtype, env)] = r
        print("| config | dtype | shardlm tok/s | PyTorch default | PyTorch tuned | vs default | "
              "vs tuned | shardlm RSS MiB | tuned RSS MiB | RSS ratio |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for config in args.configs.split(","):
            for dtype in args.dtypes.split(","):
                ours = run_shardlm(args.shardlm, data, work, config, dtype, args)
                d = torch[(config, dtype, "default")]
                t = torch[(config, dtype, "tuned")]
                print(f"| {config} | {dtype} | {ours['tokens_per_s']:.0f} | {d['tokens_per_s']:.0f} | "
                      f"{t['tokens_per_s']:.0f} | {ours['tokens_per_s'] / d['tokens_per_s']:.2f}x | "
                      f"{ours['tokens_per_s'] / t['tokens_per_s']:.2f}x | {ours['peak_rss_mib']:.0f} | "
                      f"{t['peak_rss_mib']:.0f} | {ours['peak_rss_mib'] / t['peak_rss_mib']:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
