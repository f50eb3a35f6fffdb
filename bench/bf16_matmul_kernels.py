#!/usr/bin/env python3
"""oneDNN's two bf16 matmul kernels on one training step's GEMM calls, side by side.

shardlm describes bf16 GEMM operands so that oneDNN 2.6 runs its JIT GEMM kernel
(gemm:jit); SHARDLM_BF16_MATMUL=dense lets oneDNN pick for dense operands (brgemm).
This runs bench/step_gemm_rate both ways, alternating, --rounds times per config, and
prints each shape's best GFLOP/s under each kernel and the ratio (docs/gemm.md).

usage: bench/bf16_matmul_kernels.py [--configs small,124m] [--rounds 2]
                                    [--step-gemm-rate build/bench/step_gemm_rate]
"""
import argparse
import json
import os
import subprocess
import sys

from speed_vs_pytorch import CONFIGS, ROOT  # the same two configs as issue 7's benchmark
KERNELS = {"jit": "jit", "dense (brgemm)": "dense"}


def step_gemm_rate(binary, config, kernel):
    preset, batch, seq = CONFIGS[config]
    env = dict(os.environ, SHARDLM_BF16_MATMUL=kernel)
    cmd = [binary, "--model", preset, "--batch", str(batch), "--seq", str(seq), "--precision",
           "bf16", "--passes", "1"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"step_gemm_rate failed: {' '.join(cmd)}\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="small,124m")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--step-gemm-rate", default=os.path.join(ROOT, "build", "bench",
                                                               "step_gemm_rate"))
    args = ap.parse_args()
    for config in args.configs.split(","):
        best = {label: {} for label in KERNELS}
        totals = {label: [] for label in KERNELS}
        libraries = {}
        for _ in range(args.rounds):
            for label, kernel in KERNELS.items():
                out = step_gemm_rate(args.step_gemm_rate, config, kernel)
                libraries[label] = out["library"]
                totals[label].append(out["step_gemm_seconds"])
                for shape in out["shapes"]:
                    key = (shape["name"], shape["op"], shape["M"], shape["N"], shape["K"])
                    best[label][key] = max(best[label].get(key, 0.0), shape["gflops"])
        jit, dense = KERNELS
        print(f"\n{config} bf16: best GFLOP/s of {args.rounds} rounds per shape "
              f"({jit}: {libraries[jit]}; {dense}: {libraries[dense]})\n")
        print(f"| shape | op | M x N x K | {jit} | {dense} | {jit} / {dense} |")
        print("|---|---|---|---|---|---|")
        for key, rate in best[jit].items():
            name, op, m, n, k = key
            other = best[dense][key]
            print(f"| {name} | {op} | {m} x {n} x {k} | {rate:.0f} | {other:.0f} | "
                  f"{rate / other:.3f} |")
        t_jit, t_dense = min(totals[jit]) * 1e3, min(totals[dense]) * 1e3
        print(f"| whole step's GEMMs, ms (best round) | | | {t_jit:.0f} | {t_dense:.0f} | "
              f"{t_dense / t_jit:.3f} (speed-up) |")


if __name__ == "__main__":
    main()
