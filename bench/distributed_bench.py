#!/usr/bin/env python3
"""Distributed training benchmark: prints tables measured by shardlm's own metrics.

  strategies  gpt2-small-30m, N ranks: per strategy tokens/s, step ms, comm and
              exposed comm ms, bytes on the wire per step (vs the ideal), peak
              memory per category per rank.
  scaling     DDP, same global batch: N=1 (all cores) vs N=2 (one thread each).
  mixed       the same table for zero3 and ddp under --precision bf16, with
              gradients reduced in fp32 or bf16 (--reduce-dtype), against zero3 fp32.

usage: bench/distributed_bench.py [strategies|scaling|mixed|all] [--steps S] [--ranks N]
       [--shardlm build/shardlm] [--model gpt2-small-30m]
Uses only the Python standard library; runs mpirun with this machine's flags via
`shardlm launch`.
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


def run(cmd):
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.exit(f"command failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout[-3000:]}")
    return result.stdout


def prepare(shardlm, work):
    data = os.path.join(work, "data")
    run([shardlm, "prepare", "--tokenizer", f"gpt2:{SHARED}/gpt2",
         "--input", f"{SHARED}/tinyshakespeare.txt", "--out", data])
    return data


def train(shardlm, ranks, out, args, extra):
    cmd = ["train", "--model", args.model, "--data", args.data, "--out", out,
           "--steps", str(args.steps), "--seq-len", "256", "--eval-batches", "0"] + extra
    if ranks == 1:
        run([shardlm] + cmd)
    else:
        run([shardlm, "launch", "-n", str(ranks), "--"] + cmd)
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steady = records[1:] if len(records) > 1 else records  # the first step warms caches
    med = lambda key: statistics.median(r[key] for r in steady)
    units = json.load(open(os.path.join(out, "config.json")))
    return {
        "tokens_per_s": med("tokens_per_s"), "step_ms": med("step_ms"),
        "comm_ms": med("comm_ms"), "exposed_comm_ms": med("exposed_comm_ms"),
        "comm_bytes": med("comm_bytes"), "peak": records[-1]["mem"]["peak"],
        "params": units,
    }


def mib(x):
    return f"{x / 2**20:8.1f}"


def wire_ideal(flags, psi, n):
    """Bytes per step per rank: zero3 gathers parameters twice (in the compute type)
    and reduce-scatters gradients once; the others reduce-scatter and all-gather once
    (DDP's reduced gradients, zero1/2's updated parameters) in fp32."""
    kind = flags[flags.index("--strategy") + 1]
    precision = flags[flags.index("--precision") + 1] if "--precision" in flags else "fp32"
    reduce = flags[flags.index("--reduce-dtype") + 1] if "--reduce-dtype" in flags else "fp32"
    pb = 2 if precision != "fp32" else 4
    rb = 2 if reduce == "bf16" else 4
    per_element = 2 * pb + rb if kind == "zero3" else rb + 4
    return per_element * psi * (n - 1) / n


def table(args, configurations, title):
    psi = None
    rows = []
    for name, flags in configurations:
        out = os.path.join(args.work, f"{name.replace(' ', '_')}_n{args.ranks}")
        r = train(args.shardlm, args.ranks, out,
                  args, flags + ["--micro-batch", "8", "--global-batch", str(8 * args.ranks),
                                 "--threads", "1"])
        rows.append((name, flags, r))
        if psi is None:
            psi = int(run([args.shardlm, "inspect", out]).split("elements: ")[1].split()[0])
    n = args.ranks
    print(f"\n{title}: {args.model}, N={n} ranks x 1 thread, micro-batch 8 x 256 tokens per rank, "
          f"{args.steps} steps (median after the first); Psi = {psi/1e6:.2f}M")
    print("| configuration | tokens/s | step ms | comm ms | exposed comm ms | MiB on wire/step | vs ideal "
          "| params MiB | grads MiB | optimizer MiB | activations MiB | total MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, flags, r in rows:
        ideal = wire_ideal(flags, psi, n)
        p = r["peak"]
        total = p["params"] + p["grads"] + p["optimizer"] + p["activations"]
        print(f"| {name} | {r['tokens_per_s']:.0f} | {r['step_ms']:.0f} | {r['comm_ms']:.0f} | "
              f"{r['exposed_comm_ms']:.0f} | {r['comm_bytes']/2**20:.1f} | {r['comm_bytes']/ideal:.3f} | "
              f"{mib(p['params'])} | {mib(p['grads'])} | {mib(p['optimizer'])} | "
              f"{mib(p['activations'])} | {mib(total)} |")


def strategies(args):
    table(args, [(s, ["--strategy", s]) for s in ["ddp", "zero1", "zero2", "zero3"]], "Strategies")


def mixed(args):
    bf16 = ["--precision", "bf16"]
    reduce_bf16 = ["--reduce-dtype", "bf16"]
    table(args, [("zero3 fp32", ["--strategy", "zero3"]),
                 ("zero3 bf16", ["--strategy", "zero3"] + bf16),
                 ("zero3 bf16, reduce bf16", ["--strategy", "zero3"] + bf16 + reduce_bf16),
                 ("ddp bf16", ["--strategy", "ddp"] + bf16),
                 ("ddp bf16, reduce bf16", ["--strategy", "ddp"] + bf16 + reduce_bf16)],
          "Mixed precision")


def scaling(args):
    print(f"\nDDP scaling, {args.model}, global batch 16 x 256 tokens, {args.steps} steps")
    print("| ranks x threads | tokens/s | step ms | comm ms | exposed comm ms | MiB on wire/step | ideal 2 Psi (N-1)/N MiB |")
    print("|---|---|---|---|---|---|---|")
    for ranks, threads, micro in [(1, 2, 8), (2, 1, 8)]:
        out = os.path.join(args.work, f"scaling_{ranks}")
        r = train(args.shardlm, ranks, out, args,
                  ["--strategy", "ddp", "--micro-batch", str(micro), "--global-batch", "16",
                   "--threads", str(threads)])
        psi = int(run([args.shardlm, "inspect", out]).split("elements: ")[1].split()[0])
        ideal = 2 * psi * (ranks - 1) / ranks * 4
        print(f"| {ranks} x {threads} | {r['tokens_per_s']:.0f} | {r['step_ms']:.0f} | {r['comm_ms']:.0f} | "
              f"{r['exposed_comm_ms']:.0f} | {r['comm_bytes']/2**20:.1f} | {ideal/2**20:.1f} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="all", choices=["strategies", "scaling", "mixed", "all"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--model", default="gpt2-small-30m")
    parser.add_argument("--shardlm", default=os.path.join(ROOT, "build", "shardlm"))
    args = parser.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    with tempfile.TemporaryDirectory(prefix="shardlm-bench-") as work:
        args.work = work
        args.data = prepare(args.shardlm, work)
        if args.mode in ("strategies", "all"):
            strategies(args)
        if args.mode in ("scaling", "all"):
            scaling(args)
        if args.mode in ("mixed", "all"):
            mixed(args)


if __name__ == "__main__":
    main()
