#!/usr/bin/env python3
"""A mixture of experts against its dense counterpart, shardlm against PyPI PyTorch +
transformers (issue 26's speed figure), in one run on this machine.

The two models (Hugging Face config.json files written here, so that both sides train
exactly the same architecture; random init, the byte-level tinyshakespeare batch):
  moe    Qwen3-MoE, 4 layers x H (--hidden, 512), 8:4 GQA, head_dim H/8, 8 experts of
         width H, top-2 (norm_topk_prob), load-balancing loss on (coefficient 0.001)
  dense  Qwen3 of the same shape with one MLP of width 2H = top-k x expert width:
         the MoE's active parameters but for its router (8 x H per layer)
At B=4, T=256 each expert sees ~256 of the 1024 tokens' 2048 assignments: GEMMs of
~256 x 1024 x 512 carry ~85% of the step's FLOPs.

Steps:
 1. PyTorch's fastest settings, once per model and precision: for the MoE each experts
    implementation of --experts (eager: a loop over experts, grouped_mm; batched_mm only
    when asked, see EXPERTS), then torch.compile on the fastest (eager kept, and said, when compile fails).
 2. --rounds rounds, interleaved so that the sides see the same load: shardlm (one
    process), PyTorch (the fastest eager implementation), shardlm on 2 ranks (the MoE:
    --expert-parallel 2; the dense model: ddp); the load average before each run.
 3. The GEMM library alone on the shardlm step's own GEMM calls (bench/step_gemm_rate
    --model DIR: every expert GEMM with the token count the step routes to it).
Prints medians over the rounds, shardlm's memory by category and its step by phase.

usage: bench/moe_vs_pytorch.py [--dtypes fp32,bf16] [--models moe,dense] [--hidden 512]
          [--batch 4] [--seq 256] [--steps 5] [--warmup 2] [--rounds 2] [--threads 2]
          [--experts eager,grouped_mm] [--no-compile] [--gemm-min-time 0.15]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_vs_pytorch as fam  # noqa: E402

# transformers' experts implementations tried by default. batched_mm gathers each
# assignment's expert weights ([n k, 2I, H] per layer, 4 GiB at hidden 512 in fp32) and
# reached 22 GiB peak RSS on the 24 GiB machine before it was killed: opt in with
# --experts eager,batched_mm,grouped_mm.
EXPERTS = "eager,grouped_mm"


def hf_configs(hidden):
    common = dict(hidden_size=hidden, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=hidden // 8, vocab_size=512,
                  max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  hidden_act="silu", rope_theta=1000000.0, attention_bias=False,
                  use_sliding_window=False, attention_dropout=0.0, initializer_range=0.02)
    return {
        "moe": dict(common, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                    intermediate_size=2 * hidden, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=hidden, norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[], output_router_logits=True, router_aux_loss_coef=0.001),
        "dense": dict(common, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                      intermediate_size=2 * hidden),
    }


def load():
    return os.getloadavg()[0]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def torch_run(args, config_json, data, name, dtype, impl, compiled, steps=None, warmup=None):
    """PyTorch once; None (and the reason on stderr) where the run fails."""
    sub = argparse.Namespace(**vars(args))
    sub.steps, sub.warmup = steps or args.steps, warmup if warmup is not None else args.warmup
    extra = ["--experts-implementation", impl] if impl != "-" else []
    before = load()
    try:
        out = fam.run_pytorch(args.python, config_json, data, name, dtype, compiled, sub, extra)
    except SystemExit as e:
        log(f"   PyTorch {impl}{' compiled' if compiled else ''} failed: {str(e)[-600:]}")
        return None
    out["load"] = before
    log(f"   PyTorch {impl}{' compiled' if compiled else ''}: {out['tokens_per_s']:.0f} tok/s "
        f"(load {before:.1f})")
    return out


def fastest_pytorch(args, config_json, data, name, dtype):
    """Step 1: the experts implementation (MoE) and whether compile helps."""
    probes = {}
    for impl in (args.experts.split(",") if name == "moe" else ["-"]):
        r = torch_run(args, config_json, data, name, dtype, impl, False, steps=3, warmup=1)
        if r:
            probes[impl] = r
    best_impl = max(probes, key=lambda k: probes[k]["tokens_per_s"])
    compiled = None
    if args.compile:
        compiled = torch_run(args, config_json, data, name, dtype, best_impl, True,
                             steps=args.steps, warmup=args.warmup)
        if compiled is None:
            log(f"   torch.compile failed on {name} {dtype}: eager is the PyTorch side")
    return best_impl, probes, compiled


def shardlm_run(args, data, work, name, dtype, ranks):
    extra = ([] if ranks == 1 else (["--expert-parallel", str(ranks)] if name == "moe" else []))
    before = load()
    out = fam.run_shardlm(args.shardlm, data, work, name, dtype, args, ranks=ranks, extra=extra)
    out["load"] = before
    log(f"   shardlm {ranks} rank(s){' E=' + str(ranks) if extra else ''}: "
        f"{out['tokens_per_s']:.0f} tok/s (load {before:.1f})")
    return out


def median_run(runs):
    runs = [r for r in runs if r]
    return sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2] if runs else None


def expert_shape(shape, dims):
    """A GEMM of one expert: one of its sizes is a routed token count, which no dense
    GEMM of the step has (dense sizes: tokens, hidden, widths, key/value, vocabulary,
    head chunk rows). A count that happens to equal one of those is counted as dense."""
    return any(d not in dims for d in (shape["M"], shape["N"], shape["K"]))


def library_rates(rate, hf, tokens):
    dims = {tokens, hf["hidden_size"], hf["intermediate_size"], hf.get("moe_intermediate_size", 0),
            2 * hf.get("moe_intermediate_size", 0), hf["num_key_value_heads"] * hf["head_dim"],
            hf["num_attention_heads"] * hf["head_dim"], hf["vocab_size"], rate["head_chunk_rows"],
            2 * hf["intermediate_size"]}
    out = {}
    for part in ("expert", "dense"):
        shapes = [s for s in rate["shapes"] if expert_shape(s, dims) == (part == "expert")]
        flops = sum(2.0 * s["M"] * s["N"] * s["K"] * s["calls"] for s in shapes)
        secs = sum(2.0 * s["M"] * s["N"] * s["K"] * s["calls"] / (s["gflops"] * 1e9) for s in shapes)
        out[part] = (flops, secs, len(shapes))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--models", default="moe,dense")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--experts", default=EXPERTS, help="transformers experts implementations to try")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--gemm-min-time", type=float, default=0.15,
                    help="step_gemm_rate --min-time (seconds per shape, all passes)")
    ap.add_argument("--python", default="/work/venv/bin/python")
    ap.add_argument("--shardlm", default=os.path.join(fam.ROOT, "build", "shardlm"))
    ap.add_argument("--step-gemm-rate", default=os.path.join(fam.ROOT, "build", "bench", "step_gemm_rate"))
    args = ap.parse_args()
    args.lora_rank = 0
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    configs = hf_configs(args.hidden)
    work = tempfile.mkdtemp(prefix="shardlm-moe-bench-")
    try:
        data = os.path.join(work, "data")
        fam.run([args.shardlm, "prepare", "--tokenizer", "byte", "--input",
                 os.path.join(fam.SHARED, "tinyshakespeare.txt"), "--out", data], "prepare")
        rows = {}
        for name in args.models.split(","):
            model_dir = os.path.join(work, name)
            os.makedirs(model_dir)
            config_json = os.path.join(model_dir, "config.json")
            json.dump(configs[name], open(config_json, "w"), indent=1)
            fam.CONFIGS[name] = (model_dir, args.batch, args.seq)
            for dtype in args.dtypes.split(","):
                log(f"== {name} {dtype}: PyTorch's fastest settings")
                impl, probes, compiled = fastest_pytorch(args, config_json, data, name, dtype)
                runs = {"shardlm": [], "pytorch": [], "shardlm2": []}
                for r in range(args.rounds):
                    log(f"== {name} {dtype} round {r + 1} (PyTorch experts: {impl})")
                    runs["shardlm"].append(shardlm_run(args, data, work, name, dtype, 1))
                    runs["pytorch"].append(torch_run(args, config_json, data, name, dtype, impl, False))
                    runs["shardlm2"].append(shardlm_run(args, data, work, name, dtype, 2))
                log(f"== {name} {dtype}: the GEMM library on the step's GEMMs (load {load():.1f})")
                rate = json.loads(fam.run(
                    [args.step_gemm_rate, "--model", model_dir, "--batch", str(args.batch), "--seq",
                     str(args.seq), "--precision", dtype, "--threads", str(args.threads),
                     "--min-time", str(args.gemm_min_time), "--passes", "2"],
                    "step_gemm_rate").stdout.strip().splitlines()[-1])
                rows[(name, dtype)] = dict(runs={k: median_run(v) for k, v in runs.items()},
                                           all=runs, impl=impl, probes=probes, compiled=compiled,
                                           rate=rate, hf=configs[name])
        print_tables(rows, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fmt_loads(runs):
    return "/".join(f"{r['load']:.1f}" for r in runs if r)


def print_tables(rows, args):
    tokens = args.batch * args.seq
    print(f"\nB={args.batch} T={args.seq} ({tokens} tokens/step), hidden {args.hidden}, "
          f"{args.threads} threads (2 ranks: 1 thread each), median step of {args.steps - args.warmup} "
          f"after {args.warmup} warm-up, median over {args.rounds} interleaved rounds; "
          f"load = 1-minute load average before each run (above ~1.5: not trustworthy)\n")
    print("| model | dtype | shardlm tok/s | PyTorch tok/s (eager, experts impl) | PyTorch compiled tok/s "
          "| shardlm / best PyTorch | shardlm 2 ranks tok/s | loads shardlm / PyTorch / 2 ranks |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, dtype), row in rows.items():
        ours, torch_eager, two = row["runs"]["shardlm"], row["runs"]["pytorch"], row["runs"]["shardlm2"]
        comp = row["compiled"]
        best = max([x for x in (torch_eager, comp) if x], key=lambda x: x["tokens_per_s"])
        print(f"| {name} | {dtype} | {ours['tokens_per_s']:.0f} | {torch_eager['tokens_per_s']:.0f} "
              f"({row['impl']}) | {comp['tokens_per_s']:.0f} (load {comp['load']:.1f})" if comp else
              f"| {name} | {dtype} | {ours['tokens_per_s']:.0f} | {torch_eager['tokens_per_s']:.0f} "
              f"({row['impl']}) | failed/off", end="")
        print(f" | {ours['tokens_per_s'] / best['tokens_per_s']:.2f}x | {two['tokens_per_s']:.0f} | "
              f"{fmt_loads(row['all']['shardlm'])} / {fmt_loads(row['all']['pytorch'])} / "
              f"{fmt_loads(row['all']['shardlm2'])} |")
    print("\nPyTorch's probes (3 steps, 1 warm-up), tokens/s by experts implementation:\n")
    for (name, dtype), row in rows.items():
        print(f"- {name} {dtype}: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} (load {v['load']:.1f})"
                                               for k, v in row["probes"].items()))
    print("\nMoE against its dense counterpart (tokens/s ratio, same side):\n")
    print("| dtype | shardlm moe/dense | shardlm 2 ranks moe/dense | PyTorch eager moe/dense |")
    print("|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        if ("moe", dtype) not in rows or ("dense", dtype) not in rows:
            continue
        m, d = rows[("moe", dtype)]["runs"], rows[("dense", dtype)]["runs"]
        ratio = lambda k: m[k]["tokens_per_s"] / d[k]["tokens_per_s"]
        print(f"| {dtype} | {ratio('shardlm'):.2f} | {ratio('shardlm2'):.2f} | {ratio('pytorch'):.2f} |")
    print("\nMemory by category (MiB, shardlm's MemoryTracker peak, rank 0) and peak RSS (MiB; "
          "2 ranks: the larger rank):\n")
    cats = ["params", "frozen", "grads", "optimizer", "activations", "comm", "other"]
    print("| model | dtype | ranks | " + " | ".join(cats) + " | shardlm RSS | PyTorch RSS |")
    print("|---|---|---|" + "---|" * len(cats) + "---|---|")
    for (name, dtype), row in rows.items():
        for key, ranks in (("shardlm", 1), ("shardlm2", 2)):
            ours = row["runs"][key]
            torch_rss = f"{row['runs']['pytorch']['peak_rss_mib']:.0f}" if ranks == 1 else "-"
            print(f"| {name} | {dtype} | {ranks}{' E=2' if ranks == 2 and name == 'moe' else ''} | "
                  + " | ".join(f"{ours['memory'].get(c, 0) / 2**20:.1f}" for c in cats)
                  + f" | {ours['peak_rss_mib']:.0f} | {torch_rss} |")
    print("\nGEMMs: the shardlm step (1 rank) against the GEMM library alone on the step's own "
          "calls (bench/step_gemm_rate, hot caches; expert = a GEMM whose size is a routed token "
          "count):\n")
    print("| model | dtype | model GFLOP/step | step ms | achieved GFLOP/s | library GFLOP/s (all) "
          "| achieved / library | GEMM phase ms | library ms | library / GEMM phase | expert shapes "
          "| expert GFLOP share | library GFLOP/s expert / dense shapes | library | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, dtype), row in rows.items():
        ours, rate = row["runs"]["shardlm"], row["rate"]
        achieved = rate["model_flops"] / ours["median_step_ms"] * 1e-6
        gemm_ms = ours["phase_ms"].get("gemm", float("nan"))
        lib_ms = rate["step_gemm_seconds"] * 1e3
        parts = library_rates(rate, row["hf"], tokens)
        ef, es, en = parts["expert"]
        df, ds, _ = parts["dense"]
        share = ef / (ef + df)
        split = f"{ef / es * 1e-9:.1f} / {df / ds * 1e-9:.1f}" if en else f"- / {df / ds * 1e-9:.1f}"
        print(f"| {name} | {dtype} | {rate['model_flops'] * 1e-9:.2f} | {ours['median_step_ms']:.0f} | "
              f"{achieved:.1f} | {rate['gemm_gflops']:.1f} | {achieved / rate['gemm_gflops']:.2f} | "
              f"{gemm_ms:.0f} | {lib_ms:.0f} | {lib_ms / gemm_ms:.2f} | {en} | {share:.2f} | {split} | "
              f"{rate['library']} | {rate['load_average']} |")
    print("\nshardlm step by phase (median step, ms; 'other' = step - phases: routing, gathers, "
          "the combine, exchanges):\n")
    phases = sorted({p for row in rows.values() for k in ("shardlm", "shardlm2")
                     for p in row["runs"][k]["phase_ms"]})
    print("| model | dtype | ranks | step | " + " | ".join(phases) + " |")
    print("|---|---|---|---|" + "---|" * len(phases))
    for (name, dtype), row in rows.items():
        for key, ranks in (("shardlm", 1), ("shardlm2", 2)):
            ours = row["runs"][key]
            print(f"| {name} | {dtype} | {ranks} | {ours['median_step_ms']:.0f} | "
                  + " | ".join(f"{ours['phase_ms'].get(p, 0):.0f}" for p in phases) + " |")
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
