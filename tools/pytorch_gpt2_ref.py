#!/usr/bin/python3
"""PyTorch reference trainer for shardlm's speed benchmark (bench/pytorch_ref.sh).

A nanoGPT-style GPT-2 (pre-LN, biases, GELU tanh, tied LM head, init std 0.02 and
0.02/sqrt(2L) on the residual projections) trained with AdamW (lr 6e-4, betas
0.9/0.95, weight decay 0.1 on 2-D weights, eps 1e-8) and gradient clipping at 1.0,
on random tokens or on a token file, for --steps steps. It prints one line per step
and, last, one JSON line: median step ms after the warm-up steps, tokens/s, and the
peak RSS of the process.

Run with Debian's /usr/bin/python3 (torch 1.13) on the CPU, or, on a GPU machine
(scripts/gpu_check.sh), with --device cuda --sdpa --compile: what a user would pick
there (bf16 autocast, the fused scaled_dot_product_attention, torch.compile, fused
AdamW). Benchmark only: never from tests.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, seq_len, sdpa=False):
        super().__init__()
        self.n_head = n_head
        self.sdpa = sdpa
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, seq_len, seq_len), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hd = C // self.n_head
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.sdpa:  # torch 2.x: the fused (flash / memory-efficient) kernels
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        # torch 1.13 has no fused scaled_dot_product_attention: nanoGPT's explicit path.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, seq_len, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, seq_len, sdpa)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab, seq_len, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, seq_len, sdpa) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
        # LayerNorm weights stay 1, biases 0 (their defaults).

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def load_tokens(path):
    """A flat uint16 token file, or an llm.c .bin (256 int32 header, magic 20240520)."""
    raw = np.fromfile(path, dtype=np.uint16)
    header = np.frombuffer(raw[:512].tobytes(), dtype=np.int32) if raw.size >= 512 else None
    if header is not None and header[0] == 20240520:
        return raw[512:512 + int(header[2])].astype(np.int64)
    return raw.astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the median")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--tokens", help="token file (uint16, or llm.c .bin); random tokens if absent")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention (torch 2.x)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2.x)")
    ap.add_argument("--label", default="", help="free text copied into the JSON line")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        sys.exit(f"error: --steps {args.steps} must exceed --warmup {args.warmup}")
    if args.n_embd % args.n_head != 0:
        sys.exit(f"error: --n-embd {args.n_embd} must be a multiple of --n-head {args.n_head}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    if args.tokens:
        data = load_tokens(args.tokens)
        if data.size <= args.seq_len + 1:
            sys.exit(f"error: {args.tokens} holds {data.size} tokens; need more than "
                     f"--seq-len + 1 = {args.seq_len + 1}")
        if data.max() >= args.vocab:
            sys.exit(f"error: {args.tokens} has token id {data.max()} >= --vocab {args.vocab}")
    else:
        data = None

    def batch():
        if data is None:
            x = rng.integers(0, args.vocab, size=(args.batch, args.seq_len + 1))
        else:
            starts = rng.integers(0, data.size - args.seq_len - 1, size=args.batch)
            x = np.stack([data[s:s + args.seq_len + 1] for s in starts])
        x = torch.from_numpy(x.astype(np.int64)).to(device)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    model = GPT2(args.n_layer, args.n_head, args.n_embd, args.vocab, args.seq_len, args.sdpa).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    step_model = torch.compile(model) if args.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
        **({"fused": True} if on_gpu else {"foreach": True}))

    tokens_per_step = args.batch * args.seq_len
    step_ms = []
    for step in range(args.steps):
        x, y = batch()
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if args.dtype == "bf16":
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                loss = step_model(x, y)
        else:
            loss = step_model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if on_gpu:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        step_ms.append(ms)
        print(f"step {step}: loss {loss.item():.4f} norm {norm.item():.3f} {ms:.1f} ms "
              f"({tokens_per_step / ms * 1e3:.0f} tok/s)", flush=True)

    median_ms = statistics.median(step_ms[args.warmup:])
    result = {
        "label": args.label,
        "n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd,
        "vocab": args.vocab, "batch": args.batch, "seq_len": args.seq_len,
        "dtype": args.dtype, "threads": args.threads, "params": n_params,
        "steps": args.steps, "warmup": args.warmup,
        "step_ms": [round(t, 1) for t in step_ms],
        "median_step_ms": round(median_ms, 1),
        "tokens_per_s": round(tokens_per_step / median_ms * 1e3, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "device": args.device, "sdpa": args.sdpa, "compile": args.compile,
        "peak_device_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if on_gpu else 0.0,
        "torch": torch.__version__,
        "env": {k: os.environ.get(k, "") for k in
                ("OPENBLAS_CORETYPE", "LD_PRELOAD", "LD_LIBRARY_PATH", "MALLOC_CONF")},
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
