#!/usr/bin/env python3
"""PyTorch reference trainer for bench/families_vs_pytorch.py: Hugging Face transformers'
own LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM (or a mixture of experts:
Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, MixtralForCausalLM) of a given config.json,
random init, trained with torch.optim.AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1
on 2-D weights, eps 1e-8, fused=False, foreach) and global-norm clipping at 1.0 on
windows of a shardlm token file, as a user of PyPI torch 2.x + transformers would:
attn_implementation "sdpa", bf16 autocast for --dtype bf16, --compile for
torch.compile. With --lora-rank R, PEFT's LoRA (r=R, lora_alpha, target_modules
"all-linear", dropout 0) on the frozen model, as `peft` users fine-tune; AdamW then
sees only the adapters. A mixture of experts adds router_aux_loss_coef x its load-balancing
loss when the config sets output_router_logits (as transformers' own loss does, and
shardlm), and runs its experts with --experts-implementation (transformers 5's eager loop
over experts, batched_mm or grouped_mm). Prints one line per step and, last, one JSON line: median step ms after
the warm-up steps, tokens/s and the peak RSS of the process.

Run with the PyPI venv's python (torch 2.x, transformers). Benchmark only: never
from tests.
"""
import argparse
import json
import resource
import statistics
import struct
import sys
import time

import numpy as np
import torch
import transformers


def read_tokens(path, count):
    with open(path, "rb") as f:
        header = f.read(64)
        magic, version, token_bytes, vocab, total = struct.unpack_from("<8sIIQQ", header, 0)
        assert magic.startswith(b"SHLMTOK"), f"{path}: not a shardlm token file"
        dtype = {2: np.uint16, 4: np.uint32}[token_bytes]
        data = np.frombuffer(f.read(min(count, total) * token_bytes), dtype=dtype)
    return torch.from_numpy(data.astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="a Hugging Face config.json")
    ap.add_argument("--tokens", required=True, help="shardlm train.bin")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--experts-implementation", default="eager",
                    choices=["eager", "batched_mm", "grouped_mm"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    hf = json.load(open(args.config))
    config = transformers.AutoConfig.for_model(**hf)
    moe = getattr(config, "num_experts", 0) or getattr(config, "num_local_experts", 0)
    if moe:
        config._experts_implementation = args.experts_implementation
    aux_coef = getattr(config, "router_aux_loss_coef", 0.0) if getattr(config, "output_router_logits", False) else 0.0
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                          torch_dtype=torch.float32)
    if args.lora_rank > 0:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
            target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() == 2]
    no_decay = [p for p in trainable if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    n = args.batch * args.seq_len
    tokens = read_tokens(args.tokens, (args.steps + 1) * n + 1)

    def loss_of(inputs, targets):
        out = model(input_ids=inputs)
        logits = out.logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        if aux_coef:
            loss = loss + aux_coef * out.aux_loss
        return loss

    step_fn = torch.compile(loss_of) if args.compile else loss_of
    times = []
    for step in range(args.steps):
        window = tokens[step * n:(step + 1) * n + 1]
        inputs = window[:-1].view(args.batch, args.seq_len)
        targets = window[1:].view(args.batch, args.seq_len)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = step_fn(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        print(f"step {step + 1}: loss {loss.item():.4f} {elapsed * 1e3:.0f} ms", file=sys.stderr,
              flush=True)
    median = statistics.median(times[args.warmup:])
    print(json.dumps({"label": args.label, "median_step_ms": median * 1e3,
                      "tokens_per_s": n / median,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "compile": args.compile, "dtype": args.dtype, "threads": args.threads,
                      "lora_rank": args.lora_rank,
                      "experts_implementation": model.config._experts_implementation if moe else None}))


if __name__ == "__main__":
    main()
