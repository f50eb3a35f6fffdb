#!/usr/bin/env python3
"""One layer's causal attention, forward + backward: shardlm's kernels
(build/bench/attention_bench) against PyTorch's scaled_dot_product_attention (its CPU
flash-attention kernel; enable_gqa for grouped-query shapes) on the same shapes, dtype
and thread count, alternating in one run so both see the same load on this shared
machine. Shapes: GPT-2 124M (12 heads), SmolLM2-135M (9 q : 3 kv), Qwen2.5-0.5B
(14 q : 2 kv), head_dim 64, B x T = 1 x 1024 and 8 x 256, fp32 and bf16.

GFLOP/s are on model FLOPs (forward 2 n_head hd T (T + 1) B: QK^T and PV over the
visible pairs; backward twice that), the same for both.

  python3 bench/attention_vs_pytorch.py [--threads 2] [--reps 7] [--rounds 2] [--filter qwen]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = [("gpt2", 12, 12, 64), ("smollm2-135m", 9, 3, 64), ("qwen2.5-0.5b", 14, 2, 64)]
SHAPES = [(1, 1024), (8, 256)]


def shardlm_times(binary, dtype, B, T, nh, nkv, hd, threads, reps):
    out = subprocess.run([binary, "custom", dtype, str(B), str(T), str(nh), str(nkv), str(hd),
                          str(threads), str(reps)], check=True, capture_output=True, text=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("| custom"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    return float(cells[6]), float(cells[8])  # fwd ms, bwd ms (medians)


def torch_times(torch, dtype, B, T, nh, nkv, hd, reps):
    F = torch.nn.functional
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, nh, T, hd, generator=g).to(tdtype).requires_grad_()
    k = torch.randn(B, nkv, T, hd, generator=g).to(tdtype).requires_grad_()
    v = torch.randn(B, nkv, T, hd, generator=g).to(tdtype).requires_grad_()
    dout = (0.01 * torch.randn(B, nh, T, hd, generator=g)).to(tdtype)
    fwd, bwd = [], []
    for rep in range(reps + 1):  # rep 0 warms up
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=nkv != nh)
        t1 = time.perf_counter()
        out.backward(dout)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        if rep > 0:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
    return statistics.median(fwd), statistics.median(bwd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2, help="alternations; the median is reported")
    ap.add_argument("--filter", default="")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bench", "attention_bench"))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), "
          f"{args.threads} threads, load {open('/proc/loadavg').read().split()[:3]}")
    print("| model | q:kv | B x T | dtype | shardlm fwd / bwd ms | GFLOP/s fwd / bwd "
          "| torch fwd / bwd ms | GFLOP/s fwd / bwd | torch / shardlm (total) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, nh, nkv, hd in MODELS:
        for B, T in SHAPES:
            for dtype in ("fp32", "bf16"):
                if args.filter not in f"{name} {dtype}":
                    continue
                ours, theirs = [], []
                for _ in range(args.rounds):
                    ours.append(shardlm_times(args.binary, dtype, B, T, nh, nkv, hd,
                                              args.threads, args.reps))
                    theirs.append(torch_times(torch, dtype, B, T, nh, nkv, hd, args.reps))
                sf, sb = (statistics.median(x) for x in zip(*ours))
                tf, tb = (statistics.median(x) for x in zip(*theirs))
                flops = 2.0 * nh * hd * T * (T + 1) * B
                print(f"| {name} | {nh}:{nkv} | {B} x {T} | {dtype} | {sf:.1f} / {sb:.1f} | "
                      f"{flops / sf * 1e-6:.1f} / {2 * flops / sb * 1e-6:.1f} | "
                      f"{tf:.1f} / {tb:.1f} | {flops / tf * 1e-6:.1f} / {2 * flops / tb * 1e-6:.1f} | "
                      f"{(tf + tb) / (sf + sb):.2f}x |", flush=True)
    print(f"load {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    sys.exit(main())
