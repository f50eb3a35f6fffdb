#!/usr/bin/env python3
"""Fine-tuning on GSM8K with `shardlm sft` (issue 14's measurements): full fine-tuning,
LoRA and QLoRA (NF4 base), each at N=1 and at N=2 under ddp and zero3, on a Qwen-family
shape (random init: no pretrained weights can be fetched here), ChatML-rendered GSM8K
train problems with Qwen's BPE, packed rows. For every run it prints tokens/s (median
step after the first), peak memory per category on rank 0 (MemoryTracker, from
metrics.jsonl) next to `shardlm plan`'s prediction for the same run, and the loss of the
first and last step. Standard library only.

usage: bench/sft_gsm8k.py [--model qwen2.5-0.5b] [--steps 100] [--max-len 256]
          [--micro-batch 1] [--modes full,lora,qlora] [--layouts 1,2ddp,2zero3]
          [--shardlm build/shardlm]
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
MODES = {"full": [], "lora": ["--lora-rank", "8", "--lora-alpha", "16"],
         "qlora": ["--lora-rank", "8", "--lora-alpha", "16", "--quantize-base", "nf4"]}
LAYOUTS = {"1": (1, "ddp"), "2ddp": (2, "ddp"), "2zero3": (2, "zero3")}
CATEGORIES = ["params", "frozen", "grads", "optimizer", "activations", "comm", "other"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def run(cmd, what):
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MPI_ENV})
    if result.returncode != 0:
        sys.exit(f"{what} failed: {' '.join(cmd)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--modes", default="full,lora,qlora")
    ap.add_argument("--layouts", default="1,2ddp,2zero3")
    ap.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shardlm-sft-bench-")
    rows = []
    try:
        for mode in args.modes.split(","):
            for layout in args.layouts.split(","):
                ranks, strategy = LAYOUTS[layout]
                out = os.path.join(work, f"{mode}_{layout}")
                # The same global batch (2 rows) whatever the ranks: the same data per step.
                shape = ["--model", args.model, "--micro-batch", str(args.micro_batch),
                         "--global-batch", str(2 * args.micro_batch), "--strategy", strategy] + MODES[mode]
                cmd = [args.shardlm, "sft", "--tokenizer",
                       "tiktoken:qwen:" + os.path.join(SHARED, "qwen", "qwen.tiktoken"),
                       "--dataset", os.path.join(SHARED, "sft", "gsm8k_train.jsonl"),
                       "--steps", str(args.steps), "--eval-batches", "0", "--warmup", "5",
                       "--log-every", str(args.steps), "--max-len", str(args.max_len), "--packing",
                       "--out", out] + shape
                if ranks > 1:
                    cmd = ["mpirun", "-n", str(ranks), "--oversubscribe"] + cmd
                print(f"== {mode} N={ranks} {strategy}", file=sys.stderr, flush=True)
                run(cmd, f"{mode} {layout}")
                records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
                ms = statistics.median(r["step_ms"] for r in records[1:])
                tokens = 2 * args.micro_batch * args.max_len
                plan = json.loads(run([args.shardlm, "plan", "-n", str(ranks), "--seq-len", str(args.max_len),
                                       "--data", os.path.join(out, "data"), "--json"] + shape, "plan"))
                rows.append((mode, ranks, strategy, tokens / ms * 1e3, records[0]["loss"],
                             records[-1]["loss"], records[-1]["mem"]["peak"], plan))
                shutil.rmtree(os.path.join(out, "checkpoints"), ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.model}, GSM8K train (ChatML, packed rows of {args.max_len} tokens), "
          f"global batch {2 * args.micro_batch} rows, {args.steps} steps, fp32\n")
    print("| mode | N | strategy | tokens/s | loss first | loss last | "
          + " | ".join(f"{c} MiB (plan)" for c in CATEGORIES) + " | total MiB (plan) |")
    print("|---|---|---|---|---|---|" + "---|" * (len(CATEGORIES) + 1))
    mib = 2.0 ** 20
    for mode, ranks, strategy, tps, first, last, peak, plan in rows:
        cells = [f"{peak.get(c, 0) / mib:.0f} ({plan.get(c, 0) / mib:.0f})" for c in CATEGORIES]
        total = sum(peak.get(c, 0) for c in CATEGORIES)
        print(f"| {mode} | {ranks} | {strategy} | {tps:.0f} | {first:.3f} | {last:.3f} | "
              + " | ".join(cells) + f" | {total / mib:.0f} ({plan['total'] / mib:.0f}) |")


if __name__ == "__main__":
    main()
